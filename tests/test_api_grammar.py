"""``response_format`` in the Python API: OpenAI's dicts give a Result whose text validates, a
pydantic model class gives an instance of it, every method gives the same answer, and a bad
format fails on the caller's thread naming the field."""

from __future__ import annotations

import json

import jsonschema
import pytest

import edgespec
from edgespec.errors import GrammarError

from .test_server_grammar import FORMAT, SCHEMA, Weather


@pytest.fixture(scope="module")
def llm(tiny_models):
    path = tiny_models.path(context=2048, tie=False)
    with edgespec.load(str(path), draft=str(path), progress=False) as llm:
        yield llm


def test_dict_and_model_class_formats(llm):
    plain = llm.chat("the weather?", method="none", max_tokens=60, response_format=FORMAT)
    jsonschema.validate(json.loads(plain.text), SCHEMA)
    for method in ("draft", "lookup"):
        assert llm.chat("the weather?", method=method, max_tokens=60,
                        response_format=FORMAT).text == plain.text
    parsed = llm.chat("the weather?", max_tokens=60, response_format=Weather)
    assert isinstance(parsed, Weather)
    same = {"type": "json_schema",
            "json_schema": {"name": "w", "schema": Weather.model_json_schema(), "strict": True}}
    assert parsed == Weather.model_validate_json(
        llm.chat("the weather?", max_tokens=60, response_format=same).text)


def test_a_cut_answer_names_max_tokens(llm):
    with pytest.raises(GrammarError, match="max_tokens"):
        llm.chat("the weather?", max_tokens=3, response_format=Weather)


@pytest.mark.parametrize("rf, param", [
    ({"type": "yaml"}, "response_format.type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
     "response_format.json_schema.schema"),
])
def test_bad_formats_name_the_field(llm, rf, param):
    with pytest.raises(GrammarError) as e:
        llm.chat("hi", response_format=rf)
    assert e.value.param == param


def test_stop_strings_do_not_go_with_a_response_format(llm):
    for rf in (FORMAT, Weather, {"type": "json_object"}):
        with pytest.raises(GrammarError) as e:
            llm.chat("the weather?", max_tokens=60, response_format=rf, stop=['"'])
        assert e.value.param == "stop"
    assert llm.chat("the weather?", max_tokens=8, stop=['"']).finish_reason  # no grammar: fine
