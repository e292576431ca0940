"""``response_format`` on the server: the output parses and validates (official ``openai`` client,
its pydantic ``parse`` helper included), speculation does not change it, and a malformed format
is a 400 naming the field."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pydantic
import pytest

from .live_server import HI, assert_error, chat
from .live_server import client, live, model_dir  # noqa: F401  (fixtures)

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8},
                   "rank": {"type": "integer", "minimum": 1, "maximum": 9},
                   "sunny": {"type": "boolean"}},
    "required": ["city", "rank", "sunny"],
}
FORMAT = {"type": "json_schema",
          "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=8)
    rank: int = pydantic.Field(ge=1, le=9)
    sunny: bool


def test_json_schema_answers_validate_and_speculation_keeps_them(client):
    plain = chat(client, max_tokens=60, response_format=FORMAT, extra_body={"method": "none"})
    spec = chat(client, max_tokens=60, response_format=FORMAT, extra_body={"method": "draft"})
    text = plain.choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)
    assert plain.choices[0].finish_reason == "stop"
    assert spec.choices[0].message.content == text


def test_streamed_equals_non_streamed(client):
    chunks = list(chat(client, max_tokens=60, stream=True, response_format=FORMAT))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat(client, max_tokens=60, response_format=FORMAT).choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_is_an_object_or_cut_by_the_limit(client):
    # a random model writes one endless string here; a real one closes it (test_demo_grammar.py)
    out = chat(client, max_tokens=40, response_format={"type": "json_object"}).choices[0]
    assert out.message.content.startswith('{"')
    assert out.finish_reason == "length" or isinstance(json.loads(out.message.content), dict)


def test_the_openai_parse_helper_gets_its_model(client):
    out = client.beta.chat.completions.parse(model="gpt-4o-mini", messages=HI, max_tokens=60,
                                             temperature=0, response_format=Weather)
    assert isinstance(out.choices[0].message.parsed, Weather)


def test_completions_take_response_format(live):
    r = httpx.post(live.url + "/v1/completions", json={
        "prompt": "the weather:", "max_tokens": 60, "temperature": 0, "response_format": FORMAT})
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["text"]), SCHEMA)


@pytest.mark.parametrize("rf, param", [
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "", "schema": SCHEMA}},
     "response_format.json_schema.name"),
])
def test_bad_response_formats_are_400s_naming_the_field(live, rf, param):
    r = httpx.post(live.url + "/v1/chat/completions",
                   json={"messages": HI, "max_tokens": 4, "response_format": rf})
    assert param in assert_error(r, 400, param=param)["message"]


@pytest.mark.parametrize("path, body", [
    ("chat/completions", {"messages": HI, "response_format": FORMAT, "stop": ['"']}),
    ("chat/completions", {"messages": HI, "response_format": {"type": "json_object"},
                          "stop": "}"}),
    ("completions", {"prompt": "the weather:", "response_format": FORMAT, "stop": ["\n"]}),
])
def test_stop_strings_do_not_go_with_a_response_format(live, path, body):
    # a stop string would cut the answer short ('"' made it "{"): it must parse and validate
    r = httpx.post(f"{live.url}/v1/{path}", json={"max_tokens": 60, "temperature": 0, **body})
    assert "response_format" in assert_error(r, 400, param="stop")["message"]
