"""The server takes every request field it documents and refuses every other with a 400 naming
it; the documented table is the models' own; the Host check (DNS rebinding) and CORS; fill in
the middle on /v1/completions. One server on a tiny model with StarCoder's FIM tokens.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from edgespec.fim import encode_fim
from edgespec.server import ServerSettings
from edgespec.server.field_table import markdown
from edgespec.server.middleware import host_name, host_names
from edgespec.server.request_model import RequestModel

from .live_server import HI, LiveServer, assert_error, chat
from .script_module import load_script
from .test_fim import FIM_TOKENS

ORIGIN = "http://localhost:5173"


@pytest.fixture(scope="module")
def srv(tiny_models):
    model = tiny_models.path(tie=False, extra_tokens=FIM_TOKENS)
    server = LiveServer(ServerSettings(model=str(model), allowed_hosts=("editor.internal",),
                                       cors_origins=(ORIGIN,), max_tokens_limit=64,
                                       aliases=("gpt-4o-mini",)))
    yield server
    server.stop()


def _post(srv, body: dict, path: str = "/v1/chat/completions", **kw) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=60, **kw)


# -- fields: taken, not supported, unknown ----------------------------------------------------

REFUSED = [  # (body, param, the message says)
    ({"messages": HI, "functions": [{"name": "f"}]}, "functions", "not supported"),
    ({"messages": HI, "reasoning_effort": "low"}, "reasoning_effort", "not supported"),
    ({"messages": HI, "web_search_options": {}}, "web_search_options", "not supported"),
    ({"messages": [{**HI[0], "audio": {"id": "x"}}]}, "messages.0.audio", "not supported"),
    ({"messages": HI, "temprature": 0.5}, "temprature", "unknown field"),
    ({"messages": HI, "stream_options": {"include_usage": True, "x": 1}}, "stream_options.x",
     "unknown field"),
    ({"messages": [{**HI[0], "nme": "bob"}]}, "messages.0.nme", "unknown field"),
    ({"messages": HI, "response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": {}, "strct": True}}}, "response_format.json_schema.strct",
     "unknown field"),
    ({"messages": HI, "logit_bias": {"50256": -100}}, "logit_bias", "not supported"),
    ({"messages": HI, "store": True}, "store", "keeps no completions to retrieve"),
    ({"messages": HI, "service_tier": "flex"}, "service_tier", "'auto', 'default'"),
    ({"messages": HI, "modalities": ["text", "audio"]}, "modalities", "['text']"),
    ({"messages": HI, "prompt_cache_retention": "24h"}, "prompt_cache_retention", "in_memory"),
    ({"messages": HI, "stream": True, "stream_options": {"include_obfuscation": True}},
     "stream_options.include_obfuscation", "must be false"),
    ({"messages": HI, "stream_options": {"include_usage": True}}, "stream_options",
     "stream: true"),
    ({"messages": HI, "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "16"),
    ({"messages": HI, "metadata": {"k" * 65: "v"}}, "metadata", "64 characters"),
    ({"messages": HI, "metadata": {"k": "v" * 513}}, "metadata.k", "512 characters"),
    ({"messages": HI, "metadata": {"k": 1}}, "metadata.k", ""),
    ({"messages": HI, "user": 5}, "user", ""),
]


@pytest.mark.parametrize("body, param, says", REFUSED, ids=[r[1] + "-" + r[2] for r in REFUSED])
def test_fields_not_taken_get_a_400_naming_them(srv, body, param, says):
    err = assert_error(_post(srv, body), 400, param)
    assert says in err["message"] and param.split(".")[-1] in err["message"]


def test_completions_refuse_chat_only_fields(srv):
    err = assert_error(_post(srv, {"prompt": "a", "metadata": {}}, "/v1/completions"), 400,
                       "metadata")
    assert "unknown field" in err["message"]


def test_fields_an_editor_sends_are_taken(srv):
    client = srv.client()
    plain = chat(client, max_tokens=8)
    r = chat(client, max_tokens=None, max_completion_tokens=8, user="u-1", seed=3, store=False,
             metadata={"k" * 64: "v" * 512, **{f"k{i}": "v" for i in range(15)}},
             service_tier="default", safety_identifier="hash", prompt_cache_key="repo-1",
             prompt_cache_retention="in_memory", modalities=["text"], logit_bias={},
             stream_options=None,
             # null is OpenAI's "not sent" for the fields edgespec refuses
             extra_body={"functions": None, "audio": None, "reasoning_effort": None})
    assert r.choices[0].message.content == plain.choices[0].message.content
    assert r.usage.completion_tokens == 8
    # a client echoing the assistant message back sends its null fields
    echoed = [*HI, {"role": "assistant", "content": "hi", "refusal": None, "audio": None,
                    "function_call": None}, {"role": "user", "content": "more"}]
    assert chat(client, echoed, max_tokens=2).usage.completion_tokens == 2
    streamed = list(chat(client, max_tokens=4, stream=True, stop=["\x00never"],
                         stream_options={"include_usage": True, "include_obfuscation": False}))
    assert streamed[-1].usage.completion_tokens == 4


def test_unsupported_entries_are_not_fields():
    """A field implemented by defining it on a model must leave that model's UNSUPPORTED."""
    todo, stale = [RequestModel], []
    while todo:
        for cls in todo.pop().__subclasses__():
            todo.append(cls)
            stale += [f"{cls.__name__}.{n}" for n in cls.UNSUPPORTED if n in cls.model_fields]
    assert not stale, f"implemented fields still listed as UNSUPPORTED: {stale}"


def test_the_documented_field_table_is_the_models():
    """docs/api_fields.md is generated from the request models; after changing a field, run
    `python scripts/api_fields.py` to regenerate it."""
    script = load_script("api_fields")
    assert script.OUT.read_text() == markdown(), \
        "docs/api_fields.md differs from the request models: run python scripts/api_fields.py"
    text = markdown()
    for row in ("| `suffix` |", "| `metadata` |", "| `stream_options.include_usage` |",
                "| `functions` |", "| `messages[].role` |", "| `temperature` |"):
        assert row in text, row


# -- Host check and CORS ----------------------------------------------------------------------

def test_host_names():
    assert host_name("LocalHost:8080") == "localhost" and host_name("[::1]:80") == "[::1]"
    assert host_name("::1") == "[::1]" and host_name("example.com.") == "example.com"
    assert host_names("0.0.0.0", ("a.b",)) == {"localhost", "127.0.0.1", "[::1]", "0.0.0.0", "a.b"}


@pytest.mark.parametrize("host, status", [
    ("attacker.example", 403), ("attacker.example:8080", 403), ("localhost.attacker.example", 403),
    ("127.0.0.1.nip.io", 403), ("localhost", 200), ("localhost:1234", 200), ("127.0.0.1", 200),
    ("[::1]:8080", 200), ("editor.internal:80", 200), ("EDITOR.internal", 200),
])
def test_host_header_is_one_of_the_servers_names(srv, host, status):
    for r in (httpx.get(srv.url + "/health", headers={"Host": host}),
              _post(srv, {"messages": HI, "max_tokens": 1}, headers={"Host": host})):
        assert r.status_code == status, (host, r.text)
        if status == 403:
            err = assert_error(r, 403, code="host_not_allowed")
            assert repr(host) in err["message"] and "--allowed-host" in err["message"]


def test_any_ip_address_is_a_name_of_a_wildcard_bind(tiny_models):
    from fastapi.testclient import TestClient

    from edgespec.server import ServerState, create_app

    state = ServerState.start(ServerSettings(model=str(tiny_models.path()), host="0.0.0.0"),
                              progress=False)
    try:
        for host, status in (("192.168.1.7:8080", 200), ("[fe80::1]", 200), ("0.0.0.0", 200),
                             ("attacker.example", 403), ("myhost.lan", 403)):
            client = TestClient(create_app(state), base_url=f"http://{host}")
            assert client.get("/health").status_code == status, host
    finally:
        state.stop()


def test_cors_preflight_only_for_the_given_origins(srv):
    url = srv.url + "/v1/chat/completions"
    ask = {"Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "content-type, authorization"}
    ok = httpx.options(url, headers={"Origin": ORIGIN, **ask})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in ok.headers["access-control-allow-methods"]
    other = httpx.options(url, headers={"Origin": "http://attacker.example", **ask})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    simple = _post(srv, {"messages": HI, "max_tokens": 1}, headers={"Origin": "http://evil.test"})
    assert simple.status_code == 200 and "access-control-allow-origin" not in simple.headers
    allowed = _post(srv, {"messages": HI, "max_tokens": 1}, headers={"Origin": ORIGIN})
    assert allowed.headers["access-control-allow-origin"] == ORIGIN


def test_cli_flags():
    from click.testing import CliRunner

    from edgespec.cli import main

    out = CliRunner().invoke(main, ["serve", "--help"]).output
    assert "--cors-origin ORIGIN" in out and "--allowed-host NAME" in out and "403" in out


# -- fill in the middle -----------------------------------------------------------------------

def test_suffix_builds_the_models_fim_prompt(srv):
    client = srv.client()
    prefix, suffix = "the cat", " sat on the mat\nthe cat"
    ids = encode_fim(srv.state.target.tokenizer, prefix, suffix)
    by_ids = client.completions.create(model=srv.state.model_name, prompt=ids, max_tokens=24,
                                       temperature=0, extra_body={"method": "none"})
    for method in ("none", "lookup"):
        r = client.completions.create(model=srv.state.model_name, prompt=prefix, suffix=suffix,
                                      max_tokens=24, temperature=0, extra_body={"method": method})
        assert r.choices[0].text == by_ids.choices[0].text, method
        assert r.usage.prompt_tokens == len(ids)
    parts = client.completions.create(model=srv.state.model_name, prompt=prefix, suffix=suffix,
                                      max_tokens=24, temperature=0, stream=True)
    assert "".join(p.choices[0].text for p in parts) == by_ids.choices[0].text
    err = assert_error(_post(srv, {"prompt": ids, "suffix": "x"}, "/v1/completions"), 400, "prompt")
    assert "token ids" in err["message"]


def test_a_model_without_fim_tokens_says_so(tiny_models):
    srv = LiveServer(ServerSettings(model=str(tiny_models.path())))
    try:
        with pytest.raises(openai.BadRequestError, match="no fill-in-the-middle tokens"):
            srv.client().completions.create(model=srv.state.model_name, prompt="a", suffix="b")
        r = srv.client().completions.create(model=srv.state.model_name, prompt="a", suffix="",
                                            max_tokens=2)
        assert r.usage.completion_tokens == 2  # an empty suffix: a plain completion
    finally:
        srv.stop()
