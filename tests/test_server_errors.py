"""`edgespec serve` refusing what it must refuse: bad JSON, wrong types and values, oversize
bodies, unknown routes (raw HTTP, which the client library would not send), the errors the
`openai` client sees, the API key and CORS. Each error is OpenAI-shaped JSON with a typed status.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from edgespec.config import METHODS
from edgespec.server import ServerSettings

from .live_server import HI, LIMIT, LiveServer, assert_error, chat
from .live_server import client, live, model_dir  # noqa: F401  (fixtures)

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
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "x"}}]}]}), 400, "messages.0.content.1", None),
    "audio part": (dict(json={"messages": HI + [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]}), 400,
        "messages.1.content.0", None),
    "unknown part type": (dict(json={"messages": [{"role": "user", "content": [
        {"type": "sticker"}]}]}), 400, "messages.0.content", None),  # pydantic's: the tags
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
    if case in ("image part", "audio part"):  # names the part, says what runs it
        kind = "'image_url'" if case == "image part" else "'input_audio'"
        assert kind in err["message"] and "mlx_vlm.generate" in err["message"]
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
