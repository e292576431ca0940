"""The demo model (SmolLM2-135M-Instruct) under a grammar: a schema's answer validates and is the
same with every method tried, and a JSON object closes (a random tiny model never ends one)."""

from __future__ import annotations

import json

import jsonschema
import pytest

import edgespec

pytestmark = pytest.mark.demo

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 32},
                   "country": {"type": "string", "maxLength": 32},
                   "population_millions": {"type": "number"}},
    "required": ["city", "country", "population_millions"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
ASK = "What is the capital of France? Answer in JSON with city, country and population_millions."


@pytest.fixture(scope="module")
def llm():
    with edgespec.load("demo", progress=False) as llm:
        yield llm


def test_schema_answers_validate_and_every_method_agrees(llm):
    plain = llm.chat(ASK, method="none", max_tokens=128, response_format=FORMAT)
    assert plain.finish_reason == "stop"
    answer = json.loads(plain.text)
    jsonschema.validate(answer, SCHEMA)
    for method in [m for m in ("lookup", "eagle3", "corpus") if m in llm.methods]:
        spec = llm.chat(ASK, method=method, max_tokens=128, response_format=FORMAT)
        assert spec.token_ids == plain.token_ids, method
        assert spec.stats.target_forwards < plain.stats.target_forwards, method


def test_json_object_closes(llm):
    out = llm.chat("Describe a cat as JSON with name and age.", max_tokens=256,
                   response_format={"type": "json_object"})
    assert out.finish_reason == "stop" and isinstance(json.loads(out.text), dict)
