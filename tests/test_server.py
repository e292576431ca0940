"""`edgespec serve` end to end: the real server on a loopback port, the official `openai` client.

The server runs on a uvicorn thread over a tiny random model that is also its own draft model
(the self-draft oracle: every drafted token is accepted and greedy output is unchanged). Raw
HTTP (httpx) checks what the client library would not send: bad JSON, wrong types, no key.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import uvicorn
from click.testing import CliRunner

from edgespec.config import METHODS
from edgespec.server import ServerSettings, ServerState, create_app
from edgespec.server.cli import serve

from .tiny import make_tiny_model

LIMIT = 1000  # --max-tokens-limit of the test server
HI = [{"role": "user", "content": "the cat sat on the mat"}]


class LiveServer:
    """The real app on a uvicorn thread, bound to a free loopback port."""

    def __init__(self, settings: ServerSettings):
        self.state = ServerState.start(settings, progress=False)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(self.state), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.02)

    def client(self, api_key: str = "unused") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=60)

    def health(self) -> dict:
        return httpx.get(self.url + "/health").json()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.state.stop()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # untied head: a tied random model only repeats its last token; this one says varied things
    return make_tiny_model(tmp_path_factory.mktemp("srv") / "tiny", context=2048, tie=False)


@pytest.fixture(scope="module")
def live(model_dir):
    srv = LiveServer(ServerSettings(model=str(model_dir), draft=str(model_dir),
                                    max_tokens_limit=LIMIT, aliases=("gpt-4o-mini",)))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(live):
    return live.client()


def chat(client, messages=HI, **kw):
    kw.setdefault("max_tokens", 16)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model="gpt-4o-mini", messages=messages, **kw)


def chat_text(client, messages=HI, **kw) -> str:
    return chat(client, messages, **kw).choices[0].message.content


def stream_chat(client, messages=HI, **kw) -> tuple[str, list]:
    chunks = list(chat(client, messages, stream=True, **kw))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def assert_error(r: httpx.Response, status: int, param=None, code=None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == ("invalid_request_error" if status < 500 else "server_error")
    assert (param is None or err["param"] == param) and (code is None or err["code"] == code), err
    return err


# -- the happy paths ---------------------------------------------------------------------------

def test_models_and_health(live, client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [live.state.model_name, "gpt-4o-mini"]
    h = live.health()
    assert h["status"] == "ok" and h["method"] == "draft"  # --draft given: the preferred default
    assert h["methods"] == list(METHODS)  # every method is available once a draft model is loaded


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


def test_text_parts_developer_role_and_ignored_fields(client):
    plain = chat_text(client, [{"role": "system", "content": "be brief"}, *HI])
    parts = chat_text(client, [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                               {"role": "user", "content": [{"type": "text", "text": HI[0]["content"]}]}],
                      frequency_penalty=0.5, presence_penalty=0.1, user="me", logit_bias={},
                      response_format={"type": "text"}, extra_body={"whatever": [1]})
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
    for method in METHODS:
        r = chat(client, max_tokens=30, extra_body={"method": method, "num_draft": 3})
        assert r.choices[0].message.content == plain.choices[0].message.content, method
        ran = r.usage.model_extra["speculative"]["method"]
        # a calibrated self-draft that finds no speedup turns speculation off (and says so)
        assert ran == method or (method in ("early-exit", "layer-skip") and ran == "none"), method
    drafted = chat(client, max_tokens=30, extra_body={"method": "draft", "num_draft": 3})
    assert drafted.usage.model_extra["speculative"]["tau"] > 2


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
    import edgespec.server.worker as worker_module

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
    stops at its next step, and stop() answers every job still queued with UnavailableError."""
    from fastapi.testclient import TestClient

    from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
    from edgespec.prompt import encode_prompt
    from edgespec.server.errors import UnavailableError
    from edgespec.server.worker import Done, Failed, GenRequest

    state = ServerState.start(ServerSettings(model=str(model_dir)), progress=False)
    worker, ids = state.worker, encode_prompt(state.target.tokenizer, "the cat")

    def job(n, loop):
        return worker.submit(GenRequest(ids, GenerationConfig(max_tokens=n), SamplingConfig(),
                                        SpecConfig()), loop)

    async def cancelling():
        loop = asyncio.get_running_loop()
        running, waiting = job(LIMIT, loop), job(4, loop)
        waiting.cancel()
        await running.events.get()
        running.cancel()
        probe = job(4, loop)
        while not isinstance(await asyncio.wait_for(probe.events.get(), 10), Done):
            pass
        return waiting.events.empty()

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
    assert not worker.alive and TestClient(create_app(state)).get("/health").status_code == 503


# -- bad input -----------------------------------------------------------------------------------

def _long_prompt() -> str:
    return "a" * 2100  # > 2048 tokens with the byte-level tiny tokenizer


BAD = {
    "malformed json": (dict(content=b'{"messages": [', headers={"content-type": "application/json"}),
                       400, None, None),
    "not json at all": (dict(content=b"messages=hi", headers={"content-type": "text/plain"}),
                        400, None, None),
    "missing messages": (dict(json={"model": "gpt-4o-mini"}), 400, "messages", None),
    "messages not a list": (dict(json={"messages": "hi"}), 400, "messages", None),
    "content wrong type": (dict(json={"messages": [{"role": "user", "content": 5}]}), 400,
                           "messages.0.content", None),
    "unknown role": (dict(json={"messages": [{"role": "wizard", "content": "x"}]}), 400,
                     "messages.0.role", None),
    "image part": (dict(json={"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}), 400, None, None),
    "temperature a string": (dict(json={"messages": HI, "temperature": "hot"}), 400, "temperature", None),
    "max_tokens a string": (dict(json={"messages": HI, "max_tokens": "10"}), 400, "max_tokens", None),
    "stream not a bool": (dict(json={"messages": HI, "stream": "yes"}), 400, "stream", None),
    "stop a number": (dict(json={"messages": HI, "stop": 3}), 400, "stop", None),
    "empty messages": (dict(json={"messages": []}), 400, "messages", None),
    "prompt too long": (dict(json={"messages": [{"role": "user", "content": _long_prompt()}]}), 400,
                        "messages", "context_length_exceeded"),
    "max_tokens over limit": (dict(json={"messages": HI, "max_tokens": LIMIT + 1}), 400, "max_tokens", None),
    "max_completion_tokens over limit": (dict(json={"messages": HI, "max_completion_tokens": 10**9}),
                                         400, "max_completion_tokens", None),
    "max_tokens zero": (dict(json={"messages": HI, "max_tokens": 0}), 400, None, None),
    "temperature negative": (dict(json={"messages": HI, "temperature": -1}), 400, None, None),
    "top_p zero": (dict(json={"messages": HI, "top_p": 0}), 400, None, None),
    "min_p one": (dict(json={"messages": HI, "min_p": 1.0}), 400, None, None),
    "top_k a float": (dict(json={"messages": HI, "top_k": 2.5}), 400, "top_k", None),
    "empty stop string": (dict(json={"messages": HI, "stop": [""]}), 400, None, None),
    "unknown method": (dict(json={"messages": HI, "method": "magic"}), 400, "method", None),
    "num_draft zero": (dict(json={"messages": HI, "num_draft": 0}), 400, None, None),
    "unknown model": (dict(json={"messages": HI, "model": "/etc/passwd"}), 404, "model", "model_not_found"),
    "n=2": (dict(json={"messages": HI, "n": 2}), 400, "n", None),
    "oversize body": (dict(json={"messages": [{"role": "user", "content": "x" * (1 << 20)}]}),
                      413, None, "request_too_large"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_chat_input(live, case):
    kwargs, status, param, code = BAD[case]
    err = assert_error(httpx.post(live.url + "/v1/chat/completions", **kwargs), status, param, code)
    if case == "malformed json":
        assert "not valid JSON" in err["message"]
    if case in ("temperature negative", "num_draft zero"):  # the config dataclasses' own messages
        assert err["message"].startswith(("temperature must", "num_draft must"))
    if case == "unknown method":  # the registry's methods, all of them
        assert "'magic'" in err["message"] and ", ".join(METHODS) in err["message"]


def test_request_schema_comes_from_the_configs(live):
    """The generated request fields: every config option but the server-only draft, with the
    registry's methods as the documented choices of ``method``."""
    schema = httpx.get(live.url + "/openapi.json").json()["components"]["schemas"]
    fields = schema["ChatCompletionRequest"]["properties"]
    for name in ("temperature", "top_k", "top_p", "min_p", "seed", "max_tokens", "stop", "method",
                 "num_draft", "max_draft", "adaptive", "exit_layer", "draft_bits"):
        assert name in fields, name
    assert "draft" not in fields
    assert fields["method"]["anyOf"][0]["enum"] == list(METHODS)
    assert "--max-tokens-limit" in fields["max_tokens"]["description"]


@pytest.mark.parametrize("body, param", [
    ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": "a", "echo": True}, "echo"),
    ({"prompt": "a", "suffix": "z"}, "suffix"), ({"prompt": [10**9]}, "prompt"),
    ({"prompt": ""}, None), ({"prompt": "a", "best_of": 3}, "best_of"), ({"prompt": 5}, "prompt"),
])
def test_bad_completion_input(live, body, param):
    assert_error(httpx.post(live.url + "/v1/completions", json=body), 400, param)


def test_oversize_chunked_body_and_unknown_route(live):
    def chunks():
        for _ in range(40):
            yield b"x" * 65536

    assert_error(httpx.post(live.url + "/v1/chat/completions", content=chunks()), 413)
    assert_error(httpx.get(live.url + "/v1/nothing"), 404)
    assert_error(httpx.get(live.url + "/v1/chat/completions"), 405)


def test_openai_client_sees_typed_errors(client):
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        chat(client, n=2)
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.chat.completions.create(model="llama-70b", messages=HI)
    with pytest.raises(openai.BadRequestError, match="context window"):
        chat(client, [{"role": "user", "content": _long_prompt()}])


def test_server_survives_bad_requests(live, client):
    for case in ("malformed json", "oversize body", "prompt too long"):
        kwargs = BAD[case][0]
        httpx.post(live.url + "/v1/chat/completions", **kwargs)
    assert live.health()["status"] == "ok" and chat(client).choices[0].finish_reason == "length"


# -- API key, CORS --------------------------------------------------------------------------------

def test_api_key_and_cors(model_dir):
    srv = LiveServer(ServerSettings(model=str(model_dir), api_key="sekret", aliases=("gpt-4o-mini",),
                                    cors_origins=("http://localhost:3000",)))
    try:
        url = srv.url + "/v1/chat/completions"
        body = {"messages": HI, "max_tokens": 4}
        assert_error(httpx.post(url, json=body), 401, code="invalid_api_key")
        assert_error(httpx.post(url, json=body, headers={"Authorization": "Bearer nope"}), 401)
        assert_error(httpx.get(srv.url + "/v1/models"), 401)
        with pytest.raises(openai.AuthenticationError):
            chat(srv.client("wrong"), max_tokens=4)
        assert chat(srv.client("sekret"), max_tokens=4).usage.completion_tokens == 4
        no_draft = httpx.post(url, json={**body, "method": "draft"},
                              headers={"Authorization": "Bearer sekret"})
        assert "not available" in assert_error(no_draft, 400, "method")["message"]
        assert httpx.get(srv.url + "/health").status_code == 200  # liveness needs no key
        pre = httpx.options(url, headers={"Origin": "http://localhost:3000",
                                          "Access-Control-Request-Method": "POST",
                                          "Access-Control-Request-Headers": "authorization"})
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == "http://localhost:3000"
        denied = httpx.post(url, json=body, headers={"Origin": "http://localhost:3000"})
        assert denied.status_code == 401 and denied.headers["access-control-allow-origin"]
        schema = httpx.get(srv.url + "/openapi.json").json()
        assert schema["paths"]["/v1/chat/completions"]["post"]["security"] == [{"bearer": []}]
    finally:
        srv.stop()


# -- the command --------------------------------------------------------------------------------

def test_serve_command_options_and_errors(tmp_path):
    runner = CliRunner()
    out = runner.invoke(serve, ["--help"]).output
    for flag in ("--model", "--method", "--draft", "--num-draft", "--max-draft", "--dtype",
                 "--host", "--port", "--api-key", "--max-tokens-limit", "--cors-origin"):
        assert flag in out
    r = runner.invoke(serve, ["--model", str(tmp_path / "missing"), "--port", "0"])
    assert r.exit_code == 2 and "edgespec: error:" in r.output and "no such file" in r.output
    r = runner.invoke(serve, ["--model", "x", "--method", "draft", "--port", "0"])
    assert r.exit_code == 2 and "needs a draft model" in r.output
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = runner.invoke(serve, ["--model", "x", "--port", str(busy.getsockname()[1])])
    assert r.exit_code == 2 and "cannot listen" in r.output


def test_serve_command_end_to_end(model_dir):
    """The real command in a subprocess: load, print the URL, answer, stop on SIGINT."""
    code = "import edgespec; from edgespec.server.cli import serve; serve()"
    proc = subprocess.Popen([sys.executable, "-c", code, "--model", str(model_dir), "--port", "0",
                             "--model-alias", "gpt-4o-mini"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=os.getcwd())
    try:
        line = proc.stdout.readline()
        url = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line)
        assert url, line + proc.stderr.read() if proc.poll() is not None else line
        c = openai.OpenAI(base_url=url.group(1), api_key="x", max_retries=0, timeout=30)
        assert chat(c, max_tokens=3).usage.completion_tokens == 3
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(20)
    assert proc.returncode == 0, proc.stderr.read()


# -- the demo model ------------------------------------------------------------------------------

@pytest.mark.demo
def test_demo_model_chat():
    srv = LiveServer(ServerSettings(model="demo", max_tokens_limit=64, aliases=("gpt-4o-mini",)))
    try:
        r = chat(srv.client(), [{"role": "user", "content": "What is the capital of France?"}],
                 max_tokens=12)
        assert "Paris" in r.choices[0].message.content
        assert srv.health()["served"] == 1
    finally:
        srv.stop()
