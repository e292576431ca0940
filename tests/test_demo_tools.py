"""The demo model (SmolLM2-135M-Instruct, a template without tool support: the fallback prompt)
through the server: with ``tool_choice: "required"`` it emits calls that parse and validate,
speculation changes nothing, and a named function is the one it calls."""

from __future__ import annotations

import json

import jsonschema
import pytest

from edgespec.server import ServerSettings

from .live_server import LiveServer
from .tool_samples import TOOLS

pytestmark = pytest.mark.demo

QUESTIONS = ["What is the weather in Paris for the next 3 days?",
             "Should I take an umbrella in Oslo tomorrow?"]


@pytest.fixture(scope="module")
def demo_client():
    srv = LiveServer(ServerSettings(model="demo", max_tokens_limit=200))
    yield srv.client()
    srv.stop()


def _ask(client, question: str, **kw):
    return client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": question}], tools=TOOLS,
        max_tokens=200, temperature=0, **kw).choices[0]


def _calls(choice) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]


@pytest.mark.parametrize("question", QUESTIONS)
def test_required_calls_parse_and_validate(demo_client, question):
    out = _ask(demo_client, question, tool_choice="required", extra_body={"method": "none"})
    assert out.finish_reason == "tool_calls" and out.message.tool_calls
    for name, arguments in _calls(out):
        (tool,) = [t for t in TOOLS if t["function"]["name"] == name]
        jsonschema.validate(json.loads(arguments), tool["function"]["parameters"])
    if question == QUESTIONS[0]:  # speculation (prompt lookup, forced runs) changes nothing
        spec = _ask(demo_client, question, tool_choice="required", extra_body={"method": "lookup"})
        assert _calls(spec) == _calls(out)


def test_a_named_function_is_called(demo_client):
    out = _ask(demo_client, QUESTIONS[0], parallel_tool_calls=False,
               tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert out.finish_reason == "tool_calls"
    assert [c.function.name for c in out.message.tool_calls] == ["get_time"]


def test_auto_with_a_typed_answer_gives_a_valid_call_or_answer(demo_client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                               "rain": {"type": "boolean"}},
              "required": ["city", "rain"]}
    typed = {"type": "json_schema", "json_schema": {"name": "forecast", "schema": schema,
                                                    "strict": True}}
    kw = dict(tool_choice="auto", parallel_tool_calls=False, response_format=typed)
    out = _ask(demo_client, QUESTIONS[1], extra_body={"method": "none"}, **kw)
    if out.message.tool_calls:
        assert out.finish_reason == "tool_calls"
        for name, arguments in _calls(out):
            (tool,) = [t for t in TOOLS if t["function"]["name"] == name]
            jsonschema.validate(json.loads(arguments), tool["function"]["parameters"])
    else:
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.message.content), schema)
    spec = _ask(demo_client, QUESTIONS[1], extra_body={"method": "lookup"}, **kw)
    assert (spec.message.content, spec.message.tool_calls and _calls(spec)) == (
        out.message.content, out.message.tool_calls and _calls(out))
