"""Property-based fuzzing of the server from its own OpenAPI schema (schemathesis), in process.

Requests generated to fit the schema (positive) and to break it (negative) go through the real
app, worker and tiny model; none may get a 5xx, every response must match the schema (status
code, content type, body), and every 4xx must carry OpenAI's error shape. Bounded: a few dozen
examples per mode, no deadline per example, no example database.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode, checks

from edgespec.server import ServerSettings, ServerState, create_app

EXAMPLES = 40
CHECKS = [checks.not_a_server_error, checks.status_code_conformance,
          checks.content_type_conformance, checks.response_schema_conformance]


@pytest.fixture(scope="module")
def app(tiny_models):
    model = tiny_models.path(context=256, tie=False)
    # schemathesis calls the app as Host "testserver": one of this server's names, by option
    state = ServerState.start(ServerSettings(model=str(model), max_tokens_limit=8,
                                             allowed_hosts=("testserver",)), progress=False)
    yield create_app(state)
    state.stop()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors(app, mode):
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=schema.as_strategy(generation_mode=mode))
    def check(case):
        response = case.call()
        assert response.status_code < 500, (case.as_curl_command(), response.text)
        case.validate_response(response, checks=CHECKS)
        if response.status_code >= 400:
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, response.text

    check()


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "busy", "stream": True, "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True,
                              "max_tokens": 4}),
])
def test_streamed_events_match_the_documented_schema(app, path, body):
    """The fuzzer reaches a streamed 200 only by chance; check that case every run."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    case = schema[path]["POST"].Case(body=body, media_type="application/json")
    response = case.call()
    assert response.status_code == 200, response.text
    assert response.headers["content-type"][0].startswith("text/event-stream")
    case.validate_response(response, checks=CHECKS)
