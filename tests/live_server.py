"""The server under test: the real app on a uvicorn thread over a tiny random model, the
official ``openai`` client and raw httpx for it, and the fixtures the server tests share.

The model is also its own draft model (the self-draft oracle: every drafted token is accepted
and greedy output is unchanged).
"""

from __future__ import annotations

import socket
import threading
import time

import httpx
import openai
import pytest
import uvicorn

from edgespec.server import ServerSettings, ServerState, create_app

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
def model_dir(tiny_models):
    # untied head: a tied random model only repeats its last token; this one says varied things
    return tiny_models.path(context=2048, tie=False)


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
