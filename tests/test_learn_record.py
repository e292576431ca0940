"""Recording while decoding, on a tiny random target: a recorder changes no output (plain
decoding's pipelined path, EAGLE-3, lookup), what it keeps equals teacher forcing of the
committed sequence, a reused prompt prefix, a closed decoding and the prompt cap record
consistent rows; a worker with learning records each generation, pauses idle learning for a
request and stops it when the worker stops. Waits are on events; timeouts only fail a hang."""

from __future__ import annotations

import dataclasses

import threading

import mlx.core as mx
import numpy as np
import pytest

from edgespec import engine as engine_mod
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.drafters import make_drafter
from edgespec.engine import Engine
from edgespec.heads import Eagle3Head, HeadConfig, save_head
from edgespec.learn import recorder as recorder_mod
from edgespec.learn.recorder import Recorder
from edgespec.learn.session import Learning, record_store
from edgespec.learn.store import RecordStore
from edgespec.options import spec_for
from edgespec.training.features import score_sequence
from edgespec.decoding import Step
from edgespec.worker import Call, Done, GenRequest, ThreadJob, Worker, loader

PROMPT = "the cat sat on the mat and the cat sat on the"


@pytest.fixture(scope="module")
def target(tiny_models):
    return tiny_models.load(tie=False)


@pytest.fixture(scope="module")
def head(target, tmp_path_factory):
    """A random EAGLE-3 head for the target, saved; its feature layers."""
    mx.random.seed(3)
    config = HeadConfig.for_target(target, "eagle3")
    path = save_head(tmp_path_factory.mktemp("head") / "eagle3", config, Eagle3Head(config))
    return path, tuple(config.aux_layers)


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path, target):
    monkeypatch.setenv("EDGESPEC_LEARN_DIR", str(tmp_path / "learn"))
    monkeypatch.setenv("EDGESPEC_HEADS", str(tmp_path / "no-heads"))
    monkeypatch.setattr("edgespec.heads.find.REPO_MODELS", tmp_path / "no-models")
    monkeypatch.setattr("edgespec.heads.find.WHEEL_MODELS", tmp_path / "no-models")
    monkeypatch.setattr(target.tokenizer, "eos_token_ids", frozenset())  # answers run full length


def _drafter(method: str, target, head):
    if method == "none":
        return None
    options = {"head": str(head[0])} if method == "eagle3" else {}
    return make_drafter(spec_for(method, options), target, SamplingConfig())


def check_record(target, rec, prompt: list[int], answer: list[int], layers) -> None:
    """The record's tokens are the sequence's, its rows what teacher forcing computes there."""
    aux, tokens = rec.arrays()
    first, rows = rec.meta["first"], rec.rows
    seq = prompt + answer
    assert rec.meta["prompt_ids"] == prompt and rec.meta["answer_row"] == len(prompt) - 1 - first
    assert rec.answer_tokens >= len(answer) and rows == rec.meta["answer_row"] + rec.answer_tokens
    n = min(rows + 1, len(seq) - first)
    assert tokens.tolist()[:n] == seq[first : first + n]
    full = prompt[:first] + tokens.tolist()
    want = score_sequence(target, full, len(prompt), layers, chunk=64)[0]
    want = want[first : first + rows].astype(np.float32)
    assert aux.shape == want.shape
    err = np.abs(np.asarray(aux, np.float32) - want).max()
    assert err <= 1e-2 * np.abs(want).max(), err


@pytest.mark.parametrize("method", ["none", "eagle3", "lookup"])
def test_recording_changes_nothing_and_keeps_teacher_forced_rows(method, target, head, tmp_path,
                                                                  monkeypatch):
    runs = []
    plain_run = engine_mod.plain_run
    monkeypatch.setattr(engine_mod, "plain_run", lambda *a: runs.append(1) or plain_run(*a))
    prompt = target.tokenizer.encode(PROMPT)
    plain = Engine(target, _drafter(method, target, head), reuse_prefix=False)
    want = plain.generate(prompt, max_tokens=24)
    store = RecordStore(tmp_path / "records")
    recorder = Recorder(store, head[1], "test")
    engine = Engine(target, _drafter(method, target, head), reuse_prefix=False, recorder=recorder)
    got = engine.generate(prompt, max_tokens=24)
    assert got.token_ids == want.token_ids and len(got.token_ids) == 24
    if method == "none":
        assert runs and got.stats.target_forwards == 24  # plain steps, the pipelined path
    else:
        assert got.stats.proposed > 0 and got.stats.target_forwards <= 24
    if method == "lookup":
        assert got.stats.accepted > 0  # steps that commit several rows at once
    recorder.flush()
    (rec,) = store.records()
    assert rec.meta["first"] == 0 and rec.meta["surface"] == "test"
    assert rec.meta["aux_layers"] == list(head[1])
    check_record(target, rec, prompt, got.token_ids, head[1])


@pytest.mark.parametrize("method", ["none", "eagle3"])
def test_sampled_decoding_records_the_drawn_sequence(method, target, head, tmp_path):
    """Under sampling the labels are the draws; the rows are still the sequence's, and a seeded
    request draws the same tokens with the recorder on."""
    cfg = SamplingConfig(temperature=1.0, seed=7)
    prompt = target.tokenizer.encode(PROMPT)
    want = Engine(target, _drafter(method, target, head), cfg, reuse_prefix=False).generate(
        prompt, max_tokens=16)
    store = RecordStore(tmp_path / "records")
    recorder = Recorder(store, head[1], "test")
    engine = Engine(target, _drafter(method, target, head), cfg, reuse_prefix=False,
                    recorder=recorder)
    got = engine.generate(prompt, max_tokens=16)
    assert got.token_ids == want.token_ids
    recorder.flush()
    (rec,) = store.records()
    check_record(target, rec, prompt, got.token_ids, head[1])


def test_a_reused_prompt_prefix_records_from_where_the_cache_ends(target, head, tmp_path):
    store = RecordStore(tmp_path / "records")
    recorder = Recorder(store, head[1], "test")
    engine = Engine(target, _drafter("lookup", target, head), recorder=recorder)
    prompt = target.tokenizer.encode(PROMPT)
    one = engine.generate(prompt, max_tokens=10)
    follow = prompt + one.token_ids + target.tokenizer.encode(" and then a dog")
    two = engine.generate(follow, max_tokens=10)
    assert two.stats.cached_tokens > 0
    again = engine.generate(prompt, max_tokens=10)  # the whole prompt is in the cache
    assert again.stats.cached_tokens == len(prompt) - 1 and again.token_ids == one.token_ids
    recorder.flush()
    first, second, third = store.records()
    check_record(target, first, prompt, one.token_ids, head[1])
    assert second.meta["first"] == two.stats.cached_tokens > 0  # the prefill's rows only
    check_record(target, second, follow, two.token_ids, head[1])
    assert third.meta["first"] == len(prompt) - 1 and third.meta["answer_row"] == 0
    check_record(target, third, prompt, again.token_ids, head[1])


def test_the_prompt_keeps_at_most_prompt_rows(target, head, tmp_path, monkeypatch):
    monkeypatch.setattr(recorder_mod, "PROMPT_ROWS", 3)
    store = RecordStore(tmp_path / "records")
    recorder = Recorder(store, head[1], "test")
    prompt = target.tokenizer.encode(PROMPT)
    got = Engine(target, None, reuse_prefix=False, recorder=recorder).generate(prompt, max_tokens=6)
    recorder.flush()
    (rec,) = store.records()
    assert rec.meta["answer_row"] == 3 and rec.meta["first"] == len(prompt) - 4
    check_record(target, rec, prompt, got.token_ids, head[1])


def test_a_closed_decoding_keeps_what_it_committed(target, head, tmp_path):
    store = RecordStore(tmp_path / "records")
    recorder = Recorder(store, head[1], "test")
    engine = Engine(target, None, reuse_prefix=False, recorder=recorder)
    prompt = target.tokenizer.encode(PROMPT)
    stream = engine.stream(prompt, max_tokens=50)
    seen = [t for _, step in zip(range(5), stream) for t in step.token_ids]
    stream.close()  # the client left
    recorder.flush()
    (rec,) = store.records()
    assert rec.answer_tokens == len(seen) == 5
    check_record(target, rec, prompt, seen, head[1])


def test_a_decoding_that_fails_in_the_engine_is_not_recorded(target, head, tmp_path):
    store = RecordStore(tmp_path / "records")
    recorder = Recorder(store, head[1], "test")
    drafter = _drafter("lookup", target, head)
    engine = Engine(target, drafter, reuse_prefix=False, recorder=recorder)
    calls = []
    propose = drafter.propose

    def failing(budget):
        calls.append(budget)
        if len(calls) == 3:
            raise RuntimeError("drafting failed")
        return propose(budget)

    drafter.propose = failing
    with pytest.raises(RuntimeError, match="drafting failed"):
        engine.generate(target.tokenizer.encode(PROMPT), max_tokens=10)
    recorder.flush()
    assert len(calls) == 3 and store.records() == []


# ---- in a worker --------------------------------------------------------------------------

def _generate(worker: Worker, target, text: str, tokens: int = 6) -> list:
    request = GenRequest(target.tokenizer.encode(text), GenerationConfig(max_tokens=tokens),
                         SamplingConfig(), SpecConfig(method="lookup"))
    return list(worker.events_blocking(worker.submit(ThreadJob(request)), tick=0.2))


@pytest.mark.parametrize("learns", [True, False])
def test_a_worker_with_learning_records_each_generation(learns, target):
    learning = Learning("serve") if learns else None
    worker = Worker(loader(target), learning=learning).start()
    try:
        for text in ("the cat", "hello there"):
            assert isinstance(_generate(worker, target, text)[-1], Done)
        if learns:
            learning.recorder.flush()
    finally:
        worker.stop()
    records = record_store(target).records()
    assert len(records) == (2 if learns else 0)
    if learns:
        assert {r.meta["surface"] for r in records} == {"serve"}
        assert [r.answer_tokens >= 6 for r in records] == [True, True]
        assert tuple(records[0].meta["aux_layers"]) == learning.recorder.layers


def test_generations_decoded_together_record_their_own_rows(target, head):
    """Two requests batched into the same forwards: each record is its own sequence's."""
    learning = Learning("serve")
    worker = Worker(loader(target), learning=learning).start()
    gate = threading.Event()
    try:
        worker.submit(ThreadJob(Call(lambda engine: gate.wait(30))))  # holds the thread
        texts = ["the cat sat on the mat and the cat", "hello there, hello there"]
        requests = [GenRequest(target.tokenizer.encode(t), GenerationConfig(max_tokens=12),
                               SamplingConfig(), SpecConfig(method="lookup")) for t in texts]
        jobs = [worker.submit(ThreadJob(r)) for r in requests]
        gate.set()
        answers = []
        for job in jobs:
            events = list(worker.events_blocking(job, tick=0.2))
            assert isinstance(events[-1], Done)
            answers.append([t for e in events if isinstance(e, Step) for t in e.token_ids])
        learning.recorder.flush()
    finally:
        worker.stop()
    records = {tuple(r.meta["prompt_ids"]): r for r in record_store(target).records()}
    assert len(records) == 2
    for request, answer in zip(requests, answers):
        assert len(answer) == 12
        check_record(target, records[tuple(request.prompt)], request.prompt, answer,
                     learning.recorder.layers)


def test_a_request_pauses_idle_learning_and_stopping_ends_it(target):
    learning = Learning("serve", when_idle=True, idle_after_s=0.05)
    entered, calls, paused = threading.Event(), [], []

    def idle(target_, model_dir):
        calls.append(threading.current_thread().name)
        entered.set()
        paused.append(learning.pause.wait(30))  # a training step would see the pause here
        return None

    learning.idle = idle
    worker = Worker(loader(target), learning=learning).start()
    try:
        assert entered.wait(30), "the worker never learned while idle"
        events = _generate(worker, target, "the cat")
        assert isinstance(events[-1], Done) and events[-1].stats.generated_tokens == 6
        assert paused[0] is True  # the request paused the learning, then ran
        assert set(calls) == {worker._thread.name}
        entered.clear()
        assert entered.wait(30), "idle again after the request: learning resumes"
    finally:
        worker.stop(timeout=20)
    assert not worker._thread.is_alive()  # stopping paused the idle learning too
    assert all(paused)


def test_a_record_at_its_row_limit_stops_without_a_gap(tmp_path, monkeypatch):
    """A step that does not fit ``MAX_ROWS`` ends the record's rows: a later, shorter step
    must not be appended after the skipped one (its rows would not follow the ones before)."""
    monkeypatch.setattr(recorder_mod, "MAX_ROWS", 5)
    store = RecordStore(tmp_path / "records")
    recorder = Recorder(store, (0, 1), "test")

    def out(*values):  # a forward's captured rows; each row's value names it
        rows = mx.array([[v] for v in values], dtype=mx.float32)
        return type("Out", (), {"captured": {0: rows, 1: rows + 0.5}})()

    rec = recorder.begin([5, 6, 7], 0)
    rec.prompt(out(10, 11))  # positions 0, 1 (the last prompt token is the first root)
    rec.step(out(12), [0], [8])  # position 2 committed 8
    rec.step(out(13, 14, 15), [0, 1, 2], [9, 10, 11])  # 6 rows > 5: not kept
    rec.step(out(16), [0], [12])  # fits, but would follow a gap
    rec.end()
    recorder.flush()
    (kept,) = store.records()
    aux, tokens = kept.arrays()
    assert tokens.tolist() == [5, 6, 7, 8] and kept.answer_tokens == 1
    assert aux.tolist() == [[10, 10.5], [11, 11.5], [12, 12.5]]


def test_an_idle_worker_runs_learning_once_enough_was_recorded(target, head, monkeypatch):
    """The real ``Learning.idle``: after three recorded generations (12 answer tokens in the
    training split, enough for this setting) the idle worker runs ``learn.run`` on its own
    thread, with the worker's pause event (the run itself is then asked for more data than
    there is, so that it ends before training)."""
    from edgespec.learn import run as run_mod

    monkeypatch.setenv("EDGESPEC_HEADS", str(head[0].parent))
    ran, reports, done = [], [], threading.Event()
    real = run_mod.run

    def watched(target_, model_dir, settings, *, pause=None, log=print):
        ran.append((threading.current_thread().name, pause is learning.pause, model_dir))
        try:
            more = dataclasses.replace(settings, min_answer_tokens=10**6)
            reports.append(real(target_, model_dir, more, pause=pause, log=log))
            return reports[-1]
        finally:
            done.set()

    monkeypatch.setattr(run_mod, "run", watched)
    assert target.path is not None  # idle learning needs the model's folder (replay data)
    learning = Learning("serve", when_idle=True, idle_after_s=0.05, min_answer_tokens=10)
    worker = Worker(loader(target), learning=learning).start()
    try:
        for text in ("the cat", "hello there", "tell me about the sea"):
            assert isinstance(_generate(worker, target, text)[-1], Done)
        assert done.wait(30), "idle learning never ran"
    finally:
        worker.stop(timeout=20)
    assert ran[0] == (worker._thread.name, True, target.path)
    assert reports[0]["status"].startswith("waiting for more use")  # the run's own minimum
    assert reports[0]["data"]["records"] == 3 and learning.last is reports[0]
