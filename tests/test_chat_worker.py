"""The chat runs on the generation worker (``worker.Worker``, the server's and the API's thread):
its answers are generated on the worker's thread, Escape cancels the worker's job, and the
worker's additions for it (calls, live stats, batches, a start that does not wait) keep their
contracts. Waits are on events; the deadlines only fail a test that hangs.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.errors import ModelLoadError
from edgespec.tui.app import ChatApp
from edgespec.tui.session import aopen_session
from edgespec.worker import (Call, Done, Failed, GenRequest, Live, LoopJob, ThreadJob, Worker,
                             loader)

from .test_tui import answered, drive, send, until


@pytest.fixture(scope="module")
def tiny(tiny_models) -> str:
    return str(tiny_models.path(layers=2, scale=0.03, context=4096))


def test_answer_runs_on_the_worker_thread_and_escape_cancels_it(tiny):
    """The target's forwards of an answer all run on the session's worker thread; Escape,
    pressed while a forward is held mid-answer, ends the worker's job after that step."""
    threads: list[str] = []
    entered, release = threading.Event(), threading.Event()

    async def load(status):
        session = await aopen_session(tiny, spec=SpecConfig(method="lookup"), status=status,
                                      sampling={"temperature": 0.0},
                                      generation=GenerationConfig(max_tokens=3000))
        session.target.tokenizer.eos_token_ids = frozenset()
        score = session.target.score

        def watched_score(*args, **kwargs):
            threads.append(threading.current_thread().name)
            if len(threads) == 3:  # mid-answer: hold this forward until the test lets it go
                entered.set()
                assert release.wait(30), "the test never released the forward"
            return score(*args, **kwargs)

        session.target.score = watched_score
        return session

    app = ChatApp(load, Path(tiny).name)

    async def body(pilot):
        worker_thread = app.session.worker._thread
        await send(pilot, "go on")
        await until(pilot, entered.is_set)
        job = app.session._job
        assert job is not None and not job.cancelled
        await pilot.press("escape")
        assert job.cancelled  # cancelled on the worker while its forward is still running
        release.set()
        await answered(pilot)
        assert app._last.finish_reason == "cancelled"
        assert 0 < app._last.stats.generated_tokens < 3000
        assert set(threads) == {worker_thread.name} and worker_thread is not threading.main_thread()
        assert app.session.messages[-1]["role"] == "assistant"

    drive(app, body)
    assert not app.session.worker.alive  # leaving the app stopped the worker


def test_worker_calls_live_stats_and_batches(tiny_models):
    target = tiny_models.load(layers=2, scale=0.03)
    worker = Worker(loader(target)).start()
    try:
        assert worker.call(lambda engine: (engine.target is target,
                                           threading.current_thread().name)) == (
            True, worker._thread.name)
        with pytest.raises(ZeroDivisionError):
            worker.call(lambda engine: 1 / 0)
        assert worker.alive  # a failed call does not take the worker down

        ids = target.tokenizer.encode("the cat")
        request = GenRequest(ids, GenerationConfig(max_tokens=6), SamplingConfig(),
                             SpecConfig(method="lookup"), live_stats=True)
        events = list(worker.events_blocking(worker.submit(ThreadJob(request))))
        live = [e for e in events if isinstance(e, Live)]
        assert live and isinstance(events[-1], Done)
        counts = [e.stats.generated_tokens for e in live]
        assert counts == sorted(counts) and counts[-1] == events[-1].stats.generated_tokens

        async def batched():
            assert await worker.acall(lambda engine: 7) == 7
            job = worker.submit(LoopJob(request, asyncio.get_running_loop()))
            return [batch async for batch in worker.batches(job)]

        batches = asyncio.run(batched())
        flat = [e for b in batches for e in b]
        assert isinstance(flat[-1], Done) and not any(isinstance(e, Done) for e in flat[:-1])
        assert [e.step.token_ids for e in flat if isinstance(e, Live)] == [
            e.step.token_ids for e in live]  # greedy: the same answer, however it was batched
    finally:
        worker.stop()


def test_a_start_that_does_not_wait_hands_the_loading_error_to_queued_jobs():
    gate = threading.Event()

    def failing_load():
        gate.wait(30)
        raise ModelLoadError("no such model: nowhere")

    worker = Worker(failing_load).start(wait=False)
    job = worker.submit(ThreadJob(Call(lambda engine: None)))  # queued while the model loads
    gate.set()
    events = list(worker.events_blocking(job))
    assert isinstance(events[-1], Failed) and "nowhere" in str(events[-1].error)
    worker.stop()



@pytest.mark.demo
def test_demo_chat_haiku_does_not_loop():
    """The README's first command: the demo chat with its defaults (the chat's sampling, the
    default method), asked for a haiku that greedy decoding answers with one line repeated to
    the token limit (27 times). Seeded, so the answer is reproducible."""
    from collections import Counter

    async def load(status):
        return await aopen_session("demo", spec=SpecConfig(), method_named=False,
                                   sampling={"seed": 0}, generation=GenerationConfig(),
                                   status=status)

    app = ChatApp(load, "demo")

    async def body(pilot):
        await send(pilot, "Can you write a haiku?")
        view = await answered(pilot, timeout=300)
        parts = [p.strip() for line in view.text.splitlines() for p in line.split(",")
                 if p.strip()]
        print(f"\n[{app._last.stats.summary()}, {app._last.finish_reason}]\n{view.text}")
        assert parts and max(Counter(parts).values()) < 10, view.text  # greedy: 27
        assert app.session.sampling.temperature > 0 and app.session.sampling.repetition_penalty > 1

    drive(app, body, size=(110, 32), load_timeout=300)  # a head, its first cost measurement
