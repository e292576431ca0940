"""Editor workloads in the bench: prompt rows carrying ``prediction`` or ``response_format`` run
with them (greedy output still equal to the baseline's), and rows bench cannot run are refused."""

from __future__ import annotations

import json

import pytest

from edgespec.bench import load_prompts, run_bench
from edgespec.bench_rows import valid_answer
from edgespec.config import GenerationConfig
from edgespec.engine import Engine
from edgespec.errors import ConfigError

PROMPT = "the cat sat on the mat"


def _write(tmp_path, rows) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_prediction_rows_draft_the_prediction_and_stay_exact(tiny_models, tmp_path):
    target = tiny_models.load(tie=False, seed=3)
    answer = Engine(target).generate([{"role": "user", "content": PROMPT}], max_tokens=40).text
    rows = [{"category": "edits", "turns": [PROMPT], "prediction": answer},
            {"category": "plain", "turns": [PROMPT]}]
    prompts = load_prompts(_write(tmp_path, rows))
    assert prompts[0].prediction == answer and prompts[1].prediction is None
    report = run_bench(target, "lookup", prompts, generation=GenerationConfig(40), progress=False)
    by = {(r["category"], r["method"]): r for r in report["prompts"]}
    assert all(r["exact"] for r in report["prompts"])
    assert by["edits", "lookup"]["accepted_prediction_tokens"] > 0
    assert by["edits", "none"]["accepted_prediction_tokens"] == 0  # the baseline: plain decoding
    assert by["plain", "lookup"]["accepted_prediction_tokens"] == 0
    overall = report["methods"]["lookup"]["overall"]
    kept = by["edits", "lookup"]["accepted_prediction_tokens"]
    assert overall["accepted_prediction_tokens"] == kept


@pytest.mark.parametrize("row, message", [
    ({"turns": ["x"], "tools": [{"type": "function"}]}, "'tools' (tool calls are not wired"),
    ({"turns": ["x"], "suffix": 3}, "\"suffix\" must be text"),
    ({"turns": ["x"], "suffix": "y", "response_format": {"type": "json_object"}}, "not both"),
    ({"turns": ["x"], "prediction": {"type": "content"}}, "\"prediction\" must be text"),
    ({"turns": ["x"], "response_format": {"type": "yaml"}}, "response_format.type must be one of"),
])
def test_rows_bench_cannot_run_are_refused(tmp_path, row, message):
    with pytest.raises(ConfigError, match=":1: .*" + message.replace("(", r"\(")):
        load_prompts(_write(tmp_path, [row]))


def test_valid_answer():
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}
    assert valid_answer('{"n": 3}', schema) is True
    assert valid_answer('{"n": "3"}', schema) is False
    assert valid_answer('{"n": 3', schema) is False
    assert valid_answer("[1]", {"type": "json_object"}) is False
    assert valid_answer("anything", None) is None


def test_response_format_rows_run_under_the_grammar(tiny_models, tmp_path):
    target = tiny_models.load(tie=False, seed=3)
    schema = {"type": "json_schema", "json_schema": {"name": "a", "strict": True, "schema": {
        "type": "object", "properties": {"n": {"type": "boolean"}}, "required": ["n"]}}}
    prompts = load_prompts(_write(tmp_path, [{"turns": [PROMPT], "response_format": schema}]))
    report = run_bench(target, "lookup", prompts, generation=GenerationConfig(64), progress=False)
    assert [r["exact"] for r in report["prompts"]] == [True, True]
    assert [r["valid"] for r in report["prompts"]] == [True, True]
    assert report["methods"]["lookup"]["overall"]["valid"] == "1/1"


def test_fim_rows_run_in_the_models_fim_format(tiny_models, tmp_path):
    fim = tiny_models.load(tie=False, extra_tokens=("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))
    rows = [{"category": "fim", "turns": ["def area(r):\n    a = "], "suffix": "\n    return a\n"}]
    prompts = load_prompts(_write(tmp_path, rows))
    report = run_bench(fim, "lookup", prompts, generation=GenerationConfig(24), progress=False,
                       raw=True)
    assert [r["exact"] for r in report["prompts"]] == [True, True]
    plain = tiny_models.load()  # no FIM tokens: refused before anything runs, saying so
    with pytest.raises(ConfigError, match="fill-in-the-middle"):
        run_bench(plain, "lookup", prompts, generation=GenerationConfig(4), progress=False)


def test_edits_workload_is_the_scripts_output_from_stdlib_code():
    import importlib.util
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("make_edits", "scripts/make_edits_workload.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rows = [json.loads(line) for line in Path("data/workloads/edits.jsonl").read_text().splitlines()]
    assert len(rows) >= 20
    for r in rows:  # the file is in the prompt and is the prediction: an edit keeps most of it
        assert r["prediction"].rstrip("\n") in r["turns"][0] and "standard library" in r["prediction"]
    if sys.version.split()[0] in rows[0]["source"]:  # the stdlib's text is the interpreter's
        assert script.rows() == rows
    assert [p.prediction for p in load_prompts("data/workloads/edits.jsonl")] == \
        [r["prediction"] for r in rows]
