"""The editor workload files (data/workloads/*.jsonl: edits, json, fim) are built from sources the
project may use and never from the evaluation prompts: every human-written text of every row,
predictions and suffixes included, passes the evaluation exclusion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgespec.training.exclusion import EvalExclusion, default_eval_dir, prompt_texts

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = sorted((ROOT / "data" / "workloads").glob("*.jsonl"))


def _texts(row: dict) -> list[str]:
    texts = prompt_texts(row)
    prediction = row.get("prediction")
    if isinstance(prediction, dict):
        prediction = prediction.get("content")
    for extra in (prediction, row.get("suffix")):
        if isinstance(extra, str):
            texts.append(extra)
    return texts


def test_the_three_workloads_are_shipped():
    assert {p.stem for p in WORKLOADS} >= {"edits", "json", "fim"}
    for path in WORKLOADS:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        assert len(rows) >= 20, path.name
        assert all(_texts(r) for r in rows), path.name


@pytest.mark.skipif(not (default_eval_dir() / "mt_bench.jsonl").is_file(),
                    reason="the evaluation prompts (../shared/eval) are not here")
@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.stem)
def test_no_workload_row_overlaps_an_evaluation_prompt(path):
    exclusion = EvalExclusion.from_dir()
    assert len(exclusion) >= 80
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    bad = [r.get("question_id", i) for i, r in enumerate(rows)
           if any(exclusion.overlaps(t) for t in _texts(r))]
    assert not bad, f"{path.name}: rows overlapping an evaluation prompt: {bad}"
