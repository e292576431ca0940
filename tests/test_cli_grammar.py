"""``edgespec generate --json-schema FILE``: the answer validates, the same with any method; a
bad schema file is a one-line error and a non-zero exit before the model loads."""

from __future__ import annotations

import json

import jsonschema

from .test_cli import run
from .test_server_grammar import SCHEMA


def test_generate_with_a_json_schema(tiny_models, tmp_path):
    model = str(tiny_models.path(context=2048, tie=False))
    schema = tmp_path / "weather.json"
    schema.write_text(json.dumps(SCHEMA))
    outs = []
    for method in ("none", "lookup"):
        code, out = run("generate", "--model", model, "--json", "--max-tokens", "60", "--method",
                        method, "--json-schema", str(schema), "the weather?")
        assert code == 0, out
        outs.append(json.loads(out.strip().splitlines()[-1]))
    jsonschema.validate(json.loads(outs[0]["text"]), SCHEMA)
    assert outs[0]["finish_reason"] == "stop" and outs[1]["text"] == outs[0]["text"]


def test_bad_schema_files_fail_with_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    for text, says in (('{"type": "strin"}', "strin"), ("{nope", "not JSON")):
        bad.write_text(text)
        code, out = run("generate", "--model", "demo", "--json-schema", str(bad), "hi")
        assert code != 0 and says in out and "--json-schema" in out, out


def test_stop_does_not_go_with_a_json_schema(tmp_path):
    schema = tmp_path / "weather.json"
    schema.write_text(json.dumps(SCHEMA))
    code, out = run("generate", "--model", "demo", "--json-schema", str(schema), "--stop", '"',
                    "hi")  # refused before the model loads
    assert code != 0 and "--stop" in out and "--json-schema" in out, out
