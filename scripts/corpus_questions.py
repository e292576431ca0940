"""The prompts file of a corpus source made from the shipped EAGLE-3 head's questions.

Usage: python scripts/corpus_questions.py RUN COUNT OUT — writes the first COUNT questions of
``data/SmolLM2-135M-Instruct/eagle3-questions-runRUN.jsonl.gz`` that are not among the held-out
questions (``heldout-questions.jsonl``, which design choices are measured on) to OUT, one
``{"prompt": ...}`` line each: what ``edgespec train corpus --data OUT`` reads. The file's bytes
depend on RUN and COUNT alone, so the source it makes (named after their digest:
``training/recipe.source_name``) can be traced back to the shipped questions.

The questions are the demo model's own Magpie questions; every one passes the evaluation
exclusion (``tests/test_shipped_heads.py``, on every CI run). ``edgespec train corpus --model demo
--data OUT --out DIR``, DIR a copy of ``models/SmolLM2-135M-Instruct/corpus``, adds the model's
answers to them as one more source, without a GPU; ``edgespec bench --methods
none,corpus@models/SmolLM2-135M-Instruct/corpus,corpus@DIR`` then compares the two corpora.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from edgespec.bench import load_prompts

DATA = Path(__file__).resolve().parents[1] / "data" / "SmolLM2-135M-Instruct"


def held_out() -> set[str]:
    """The held-out questions' texts (a bench prompts file: the first turn of each)."""
    return {p.text.strip() for p in load_prompts(DATA / "heldout-questions.jsonl")}


def questions_file(run: int, count: int) -> bytes:
    """The prompts file's bytes: run ``run``'s first ``count`` questions outside the held-out
    set, in their order; ValueError when the run has fewer."""
    held, lines = held_out(), []
    with gzip.open(DATA / f"eagle3-questions-run{run}.jsonl.gz", "rt") as f:
        for line in f:
            prompt = json.loads(line)["prompt"]
            if prompt.strip() in held:
                continue
            lines.append(json.dumps({"prompt": prompt}) + "\n")
            if len(lines) == count:
                return "".join(lines).encode()
    raise ValueError(f"run {run} has {len(lines)} questions outside the held-out set, "
                     f"fewer than {count}")


def main(run: str, count: str, out: str) -> None:
    Path(out).write_bytes(questions_file(int(run), int(count)))


if __name__ == "__main__":
    main(*sys.argv[1:])
