"""`edgespec serve` end to end: the real server on a loopback port, the official `openai` client.

The server (``live_server.py``) runs on a uvicorn thread over a tiny random model that is also
its own draft model (the self-draft oracle: every drafted token is accepted and greedy output
is unchanged). Bad input, keys and CORS: ``test_server_errors.py``; the command:
``test_server_command.py``.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time

import httpx
import openai
import pytest

from edgespec.config import METHODS
from edgespec.drafters import registry
from edgespec.server import ServerSettings, ServerState, create_app

from .live_server import HI, LIMIT, assert_error, chat, chat_text, stream_chat
from .live_server import client, live, model_dir  # noqa: F401  (fixtures)

# -- the happy paths ---------------------------------------------------------------------------

def _own_head(method: str) -> bool:
    """Whether ``method`` needs a trained head or the checkpoint's MTP layer (the test model
    has neither)."""
    return registry.get(method).needs_head or registry.get(method).needs_mtp


def test_models_and_health(live, client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [live.state.model_name, "gpt-4o-mini"]
    h = live.health()
    assert h["status"] == "ok" and h["method"] == "draft"  # --draft given: the preferred default
    # every method is available once a draft model is loaded, but those needing a trained head
    # (none exists for this model: test_drafting_heads.py serves one)
    assert h["methods"] == [m for m in METHODS if not _own_head(m)]


def test_chat_non_streaming_shape_and_usage(client):
    r = chat(client, max_tokens=12)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    spec = r.usage.model_extra["speculative"]
    assert spec["method"] == "draft" and spec["proposed"] == spec["accepted"] > 0 and spec["tau"] > 1


def test_chat_streaming_equals_non_streaming_and_reports_usage(client):
    full = chat_text(client, max_tokens=20)
    text, chunks = stream_chat(client, max_tokens=20, stream_options={"include_usage": True})
    assert text == full
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 20
    assert set(last.usage.model_extra["speculative"]) >= {"method", "tau", "proposed", "accepted"}
    _, chunks = stream_chat(client, max_tokens=5)  # without include_usage: no usage chunk
    assert all(c.usage is None and c.choices for c in chunks)


def test_completions_streaming_and_not(client):
    r = client.completions.create(model="gpt-4o-mini", prompt="the cat", max_tokens=10, temperature=0)
    assert r.object == "text_completion" and r.usage.completion_tokens == 10
    parts = list(client.completions.create(model="gpt-4o-mini", prompt="the cat", max_tokens=10,
                                           temperature=0, stream=True,
                                           stream_options={"include_usage": True}))
    assert "".join(p.choices[0].text for p in parts if p.choices) == r.choices[0].text
    assert parts[-1].usage.prompt_tokens == r.usage.prompt_tokens
    one = client.completions.create(model="gpt-4o-mini", prompt=["the cat"], max_tokens=10, temperature=0)
    assert one.choices[0].text == r.choices[0].text  # a one-element list is the same prompt


def test_prompt_token_ids(live, client):
    ids = live.state.target.tokenizer.encode("the cat")
    by_text = client.completions.create(model="gpt-4o-mini", prompt="the cat", max_tokens=8, temperature=0)
    by_ids = client.completions.create(model="gpt-4o-mini", prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_text_parts_developer_role_and_accounting_fields(client):
    """Fields that change nothing about the answer (test_server_fields.py: what is refused)."""
    plain = chat_text(client, [{"role": "system", "content": "be brief"}, *HI])
    parts = chat_text(client, [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                               {"role": "user", "content": [{"type": "text", "text": HI[0]["content"]}]}],
                      user="me", logit_bias={}, metadata={"editor": "x"}, store=False,
                      service_tier="auto", response_format={"type": "text"})
    assert parts == plain


def test_stop_strings(client):
    text = chat_text(client, max_tokens=40)
    stop = next(text[k:k + 2] for k in range(1, len(text)) if re.fullmatch("[ -~]{2}", text[k:k + 2]))
    expected = text[: text.index(stop)]
    for given in (stop, [stop, "\x00never"]):
        r = chat(client, max_tokens=40, stop=given)
        assert r.choices[0].message.content == expected and r.choices[0].finish_reason == "stop"
        streamed, _ = stream_chat(client, max_tokens=40, stop=given)
        assert streamed == expected


def test_seeds_reproduce_sampling(client):
    first = chat_text(client, temperature=1.0, seed=1234, max_tokens=24)
    assert chat_text(client, temperature=1.0, seed=1234, max_tokens=24) == first
    assert len({chat_text(client, temperature=1.0, seed=s, max_tokens=24) for s in range(4)}) > 1
    # edgespec's extra sampling fields go to the same SamplingConfig: top_k=1 is greedy
    assert chat_text(client, temperature=1.0, seed=5, max_tokens=24, extra_body={"top_k": 1}) == \
        chat_text(client, temperature=0, max_tokens=24)


def test_every_method_equals_plain_decoding(client):
    """Greedy output is the same whichever method a request picks; the self-draft oracle
    (the target drafting for itself) changes nothing but the number of forwards."""
    plain = chat(client, max_tokens=30, extra_body={"method": "none"})
    assert plain.usage.model_extra["speculative"]["tau"] == 1.0
    for method in (m for m in METHODS if not _own_head(m)):
        r = chat(client, max_tokens=30, extra_body={"method": method, "num_draft": 3})
        assert r.choices[0].message.content == plain.choices[0].message.content, method
        ran = r.usage.model_extra["speculative"]["method"]
        # a calibrated self-draft that finds no speedup turns speculation off (and says so)
        assert ran == method or (method in ("early-exit", "layer-skip") and ran == "none"), method
    drafted = chat(client, max_tokens=30, extra_body={"method": "draft", "num_draft": 3})
    assert drafted.usage.model_extra["speculative"]["tau"] > 2


@pytest.mark.parametrize("method, layers", [("early-exit", 1), ("layer-skip", [1])])
def test_self_drafts_that_do_draft_equal_plain_decoding(client, monkeypatch, method, layers):
    """On the tiny model, calibration finds that early exit and layer skip do not pay and they
    decode plainly (above). With calibration's choice forced, the drafter the server builds per
    request really drafts, and the output is still plain decoding's."""
    import edgespec.drafters.calibrate as calibrate

    forced = calibrate.CalibrationResult(layers, [], "forced by the test")
    monkeypatch.setattr(calibrate, "calibrated", lambda target, method, num_draft: forced)
    for messages in (HI, [{"role": "user", "content": "once upon a time, far away"}]):
        plain = chat(client, messages, max_tokens=30, extra_body={"method": "none"})
        r = chat(client, messages, max_tokens=30, extra_body={"method": method, "num_draft": 3})
        assert r.choices[0].message.content == plain.choices[0].message.content
        spec = r.usage.model_extra["speculative"]
        assert spec["method"] == method and spec["proposed"] > 0, spec


def test_concurrent_clients_equal_their_single_request_outputs(live):
    """8 clients at once: each greedy output equals the same request run alone."""
    def request(i: int) -> str:
        c = live.client()
        messages = [{"role": "user", "content": f"request {i}: " + "the quick brown fox " * (i % 3 + 1)}]
        kw = {"max_tokens": 16 + 4 * i, "extra_body": {"method": ("none", "draft")[i % 2]}}
        if i % 4 == 3:
            return c.completions.create(model="gpt-4o-mini", prompt=messages[0]["content"],
                                        temperature=0, **kw).choices[0].text
        if i % 2:
            return stream_chat(c, messages, **kw)[0]
        return chat_text(c, messages, **kw)

    alone = [request(i) for i in range(8)]
    results: dict[int, str] = {}
    barrier = threading.Barrier(8)

    def run(i):
        barrier.wait()
        results[i] = request(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [results.get(i) for i in range(8)] == alone


def test_disconnect_mid_stream_cancels_and_next_request_is_served(live, client):
    reference = chat_text(client, max_tokens=16)
    before = live.health()["cancelled"]
    body = {"model": "gpt-4o-mini", "messages": HI, "max_tokens": LIMIT, "temperature": 0,
            "stream": True, "method": "none"}
    with httpx.Client(timeout=30) as h, h.stream("POST", live.url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        data = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                data.append(line)
            if len(data) == 3:
                break  # hang up: leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 10
    while live.health()["cancelled"] == before or live.health()["busy"]:
        assert time.monotonic() < deadline, "the disconnected stream was not cancelled"
        time.sleep(0.05)
    assert chat_text(client, max_tokens=16) == reference


def test_generation_failure_is_that_requests_error_only(live, client, monkeypatch):
    """An exception inside generation answers that request (500, or an error event mid-stream);
    the worker lives on and the next request is served."""
    import edgespec.worker as worker_module

    reference = chat_text(client)

    def broken(*args, **kwargs):
        raise RuntimeError("drafter exploded")

    monkeypatch.setattr(worker_module, "make_drafter", broken)
    r = httpx.post(live.url + "/v1/chat/completions", json={"messages": HI, "max_tokens": 4})
    assert "internal server error" in assert_error(r, 500)["message"]
    with pytest.raises(openai.APIError, match="internal server error"):
        stream_chat(client)
    monkeypatch.undo()
    assert chat_text(client) == reference and live.health()["failed"] >= 2


def test_worker_skips_cancelled_jobs_and_fails_queued_ones_on_stop(model_dir):
    """No queued request waits forever: a job cancelled while queued is skipped, a running one
    stops at its next step (both end with Done "cancelled"), and stop() answers every job still
    queued with UnavailableError."""
    from fastapi.testclient import TestClient

    from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
    from edgespec.prompt import encode_prompt
    from edgespec.errors import UnavailableError
    from edgespec.worker import Done, Failed, GenRequest, LoopJob

    # one generation at a time, so that jobs wait in the queue behind the running one
    state = ServerState.start(ServerSettings(model=str(model_dir), max_concurrency=1),
                              progress=False)
    worker, ids = state.worker, encode_prompt(state.target.tokenizer, "the cat")

    def job(n, loop):
        return worker.submit(LoopJob(GenRequest(ids, GenerationConfig(max_tokens=n),
                                                SamplingConfig(), SpecConfig()), loop))

    async def cancelling():
        loop = asyncio.get_running_loop()
        running, waiting = job(LIMIT, loop), job(4, loop)
        waiting.cancel()
        await running.events.get()
        running.cancel()
        probe = job(4, loop)
        while not isinstance(await asyncio.wait_for(probe.events.get(), 10), Done):
            pass
        skipped = [waiting.events.get_nowait() for _ in range(waiting.events.qsize())]
        stopped = [running.events.get_nowait() for _ in range(running.events.qsize())]
        return [type(e) for e in skipped] == [Done] and skipped[0].finish_reason == "cancelled" \
            and stopped[-1].finish_reason == "cancelled"

    async def stopping():
        loop = asyncio.get_running_loop()
        running, queued = job(300, loop), [job(4, loop) for _ in range(3)]
        await running.events.get()  # it runs; the others wait behind it
        await asyncio.to_thread(state.stop)
        ends = [await asyncio.wait_for(j.events.get(), 5) for j in queued]
        rest = [running.events.get_nowait() for _ in range(running.events.qsize())]
        return ends, rest

    assert asyncio.run(cancelling()) and worker.counts["cancelled"] == 2
    ends, rest = asyncio.run(stopping())
    assert all(isinstance(e, Failed) and isinstance(e.error, UnavailableError) for e in ends)
    assert isinstance(rest[-1], Done)  # the running job was let finish
    assert not worker.alive and TestClient(create_app(state), base_url="http://localhost").get("/health").status_code == 503
