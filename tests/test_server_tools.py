"""Tool calls on the server, through the official ``openai`` client: a required call validates
(and speculation does not change it), streamed calls reassemble to the whole answer's, the
round trip (call -> tool message -> answer) renders the result into the prompt, tools with a
``response_format`` give a call or the typed answer, and bad tool fields (stop strings with a
grammar among them) are 400s naming them."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from edgespec.server.convert import chat_request
from edgespec.server.schemas import ChatCompletionRequest

from .live_server import HI, assert_error, chat
from .live_server import client, live, model_dir  # noqa: F401  (fixtures)
from .tool_samples import TOOLS, WEATHER

TIME_CHOICE = {"type": "function", "function": {"name": "get_time"}}


def _calls(message) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def _validate(name: str, arguments: str) -> None:
    (tool,) = [t for t in TOOLS if t["function"]["name"] == name]
    jsonschema.validate(json.loads(arguments), tool["function"]["parameters"])


def test_a_required_call_validates_and_speculation_keeps_it(client):
    kw = dict(tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=120)
    plain = chat(client, extra_body={"method": "none"}, **kw).choices[0]
    spec = chat(client, extra_body={"method": "draft"}, **kw).choices[0]
    assert plain.finish_reason == "tool_calls" and plain.message.content is None
    (call,) = plain.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    _validate(call.function.name, call.function.arguments)
    assert _calls(spec.message) == _calls(plain.message)


def test_a_named_function_is_the_one_called(client):
    out = chat(client, tools=TOOLS, tool_choice=TIME_CHOICE, parallel_tool_calls=False,
               max_tokens=120).choices[0]
    assert out.finish_reason == "tool_calls"
    assert {name for name, _ in _calls(out.message)} == {"get_time"}
    for name, arguments in _calls(out.message):
        _validate(name, arguments)


def test_streamed_calls_reassemble_to_the_whole_answers(client):
    kw = dict(tools=TOOLS, tool_choice="required", max_tokens=600)  # room for 4 calls
    whole = chat(client, **kw).choices[0]
    chunks = [c for c in chat(client, stream=True, **kw) if c.choices]
    calls: dict[int, dict] = {}
    for c in chunks:
        for d in c.choices[0].delta.tool_calls or []:
            if d.index not in calls:  # OpenAI's first chunk of a call: id, type, name, ""
                assert d.id and d.type == "function" and d.function.name
                assert d.function.arguments == ""
                calls[d.index] = {"name": d.function.name, "arguments": ""}
            else:
                assert d.id is None and d.function.name is None
                calls[d.index]["arguments"] += d.function.arguments
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == _calls(whole.message)
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    content = "".join(c.choices[0].delta.content or "" for c in chunks) or None
    assert content == whole.message.content


def test_the_round_trip_call_tool_message_answer(client):
    first = chat(client, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                 max_tokens=120).choices[0].message
    (call,) = first.tool_calls
    def turn(result: str, **kw):
        messages = HI + [first.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": result}]
        return chat(client, messages, tools=[WEATHER], max_tokens=8, **kw)

    answer = turn("sunny, 21C", tool_choice="none")
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].message.content
    # the tool's result reaches the prompt: a longer result, a longer prompt
    longer = turn("sunny, 21C, light wind from the west, no rain", tool_choice="none")
    assert longer.usage.prompt_tokens > answer.usage.prompt_tokens
    # the answer turn with the tools still offered: a reply or a valid call
    auto = turn("sunny, 21C", tool_choice="auto").choices[0]
    assert auto.finish_reason in ("stop", "length", "tool_calls")
    assert auto.message.content or auto.message.tool_calls
    for name, arguments in _calls(auto.message):
        _validate(name, arguments)
    assert turn("sunny, 21C").usage.prompt_tokens > answer.usage.prompt_tokens  # tools shown


def test_the_tool_result_is_rendered_into_the_prompt(live):
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'}}
    messages = HI + [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"}]
    request = chat_request(ChatCompletionRequest(messages=messages, tools=[WEATHER]), live.state)
    text = live.state.target.tokenizer.decode(request.prompt)
    assert "sunny, 21C" in text and '"city": "Oslo"' in text and "get_weather" in text


def test_tool_choice_none_answers_in_text(client):
    a = chat(client, tools=TOOLS, tool_choice="none", max_tokens=8).choices[0]
    b = chat(client, max_tokens=8).choices[0]
    assert a.message.tool_calls is None and a.finish_reason in ("stop", "length")
    assert a.message.content == b.message.content  # the tools are not in the prompt


ANSWER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                         "warm": {"type": "boolean"}},
          "required": ["city", "warm"]}
TYPED = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}


def _call_or_answer(choice) -> str:
    """Which branch an answer under tools + response_format took, after checking it is valid."""
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        for name, arguments in _calls(choice.message):
            _validate(name, arguments)
        return "call"
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), ANSWER)
    return "answer"


def test_tools_with_a_response_format_give_a_call_or_the_typed_answer(client):
    kw = dict(tools=TOOLS, response_format=TYPED, parallel_tool_calls=False, max_tokens=300)
    required = chat(client, tool_choice="required", **kw).choices[0]
    assert _call_or_answer(required) == "call"
    assert _call_or_answer(chat(client, tool_choice="none", **kw).choices[0]) == "answer"
    plain = chat(client, extra_body={"method": "none"}, **kw).choices[0]  # "auto"
    spec = chat(client, extra_body={"method": "draft"}, **kw).choices[0]
    assert _call_or_answer(plain) in ("call", "answer")
    assert (_calls(spec.message), spec.message.content) == (_calls(plain.message),
                                                            plain.message.content)
    seen = {_call_or_answer(chat(client, temperature=1.5, seed=s, **kw).choices[0])
            for s in range(6)}
    assert seen <= {"call", "answer"}
    obj = chat(client, tools=TOOLS, response_format={"type": "json_object"}, max_tokens=300,
               temperature=0).choices[0]
    assert obj.finish_reason in ("stop", "tool_calls")
    assert obj.message.tool_calls or isinstance(json.loads(obj.message.content), dict)


@pytest.mark.parametrize("extra,param", [
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ({"messages": [*HI, {"role": "tool", "content": "x"}]}, "tool_call_id"),
    ({"tools": TOOLS, "tool_choice": "required", "stop": ["\n"]}, "stop"),  # cut the call
    ({"tools": TOOLS, "tool_choice": TIME_CHOICE, "stop": "}"}, "stop"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}, "stop": "}"}, "stop"),
])
def test_bad_tool_fields_are_400s_naming_them(live, extra, param):
    body = {"messages": HI, "max_tokens": 4, **extra}
    assert_error(httpx.post(live.url + "/v1/chat/completions", json=body), 400, param)
