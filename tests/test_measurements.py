"""docs/measurements.md: every bench table is generated from its committed bench JSON and matches
it (scripts/measurements_tables.py), and the script finds stale, hand-copied and broken tables."""

from __future__ import annotations

import json
import re

import pytest

from edgespec.bench import summarize
from edgespec.errors import ConfigError

from .script_module import load_script

tables = load_script("measurements_tables")


def test_every_generated_table_matches_its_json():
    text = tables.DOC.read_text(encoding="utf-8")
    assert tables.regions(text), "docs/measurements.md has no generated bench table"
    new, stale = tables.regenerate(text)
    assert stale == [], f"stale tables: {stale}; run python scripts/measurements_tables.py"
    assert new == text


def test_every_bench_table_in_the_doc_is_generated():
    lines = tables.hand_copied(tables.DOC.read_text(encoding="utf-8"))
    assert lines == [], (f"docs/measurements.md lines {lines}: bench tables not generated from "
                         "a JSON file (markers) nor kept as recorded text (a fenced block)")


def _report(prompts_file: str) -> dict:
    row = dict(generated_tokens=10, target_forwards=10, proposed=0, accepted=0, forced=0,
               prefill_s=0.1, decode_s=1.0, draft_s=0.0, verify_s=0.9, peak_memory_mb=100.0,
               accepted_prediction_tokens=0, rejected_prediction_tokens=0, exact=True,
               valid=None)
    rows = [dict(row, prompt=0, category="writing", method="none"),
            dict(row, prompt=0, category="writing", method="lookup", target_forwards=5,
                 proposed=8, accepted=5, decode_s=0.5)]
    env = dict(backend="cpu", device="Test CPU", blas="none", dtype="float32", model="tiny",
               draft_model=None, num_draft=None, mlx_version="0", edgespec_version="0",
               max_tokens=10, prompts_file=prompts_file, num_prompts=1,
               sampling={"temperature": 0.0}, cpu_count=2, platform="test")
    return dict(summarize(rows), env=env)


@pytest.fixture
def root(tmp_path):
    (tmp_path / "docs" / "bench").mkdir(parents=True)
    (tmp_path / "docs" / "bench" / "run.json").write_text(json.dumps(_report("../x/mt.jsonl")))
    return tmp_path


def test_a_stale_table_is_named_and_rewritten(root):
    text = "intro\n<!-- table: docs/bench/run.json overall -->\nold\n<!-- /table -->\nend\n"
    new, stale = tables.regenerate(text, root)
    assert stale == ["docs/bench/run.json"]
    assert "| lookup | **overall** | 1 | 2.00 | 62% | 20.0 | 2.00× |" in new
    assert "| lookup | writing |" not in new  # overall: no category rows
    assert "prompts from mt.jsonl ·" in new  # a prompts file outside the repository: its name
    assert new.startswith("intro\n") and new.endswith("<!-- /table -->\nend\n")
    assert tables.regenerate(new, root) == (new, [])


def test_without_options_the_categories_are_kept(root):
    new, _ = tables.regenerate("<!-- table: docs/bench/run.json -->\n<!-- /table -->", root)
    assert "| lookup | writing | 1 | 2.00 |" in new


@pytest.mark.parametrize("text, message", [
    ("<!-- table: docs/bench/run.json -->\n", "line 1: table docs/bench/run.json is never closed"),
    ("x\n<!-- /table -->\n", "line 2: <!-- /table --> without an opening"),
    ("<!-- table: docs/bench/run.json -->\n<!-- table: docs/bench/run.json -->\n<!-- /table -->",
     "line 2: a table marker inside the table opened on line 1"),
    ("<!-- table: docs/bench/run.json sorted -->\n<!-- /table -->",
     "unknown option(s) 'sorted'; allowed: overall"),
    ("<!-- table: docs/bench/gone.json -->\n<!-- /table -->",
     "table docs/bench/gone.json: no such"),
])
def test_broken_markers_are_refused_naming_the_line_or_file(root, text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        tables.regenerate(text, root)


def test_hand_copied_bench_tables_are_found_outside_markers_and_fences():
    table = "| method | τ | speedup |\n|---|---:|---:|\n| none | 1.00 | 1.00× |\n"
    other = "| model | 1 | 2 |\n|---|---:|---:|\n| dense | 1.0 | 2.0 |\n"
    text = f"a\n\n{table}\n```text\n{table}```\n\n{other}"
    assert tables.hand_copied(text) == [3]


def test_check_exits_nonzero_naming_the_stale_table(root, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tables, "ROOT", root)
    doc = tmp_path / "m.md"
    doc.write_text("<!-- table: docs/bench/run.json -->\nold\n<!-- /table -->\n")
    assert tables.main(["--check", str(doc)]) == 1
    assert "the table of docs/bench/run.json differs from its JSON" in capsys.readouterr().err
    assert "old" in doc.read_text()  # --check writes nothing
    assert tables.main([str(doc)]) == 0
    assert tables.main(["--check", str(doc)]) == 0
