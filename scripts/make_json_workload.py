"""Build ``data/workloads/json.jsonl``: questions answered under a JSON schema (``edgespec bench``).

Usage: python scripts/make_json_workload.py [OUT]

Source: the demo model's own held-out Magpie questions (``data/SmolLM2-135M-Instruct/
heldout-questions.jsonl``: no head or corpus trained on them; see data/README.md), never the
evaluation prompts. Each row is a bench prompt row plus OpenAI's ``response_format`` with one
schema (``SCHEMA``: a short answer, its topic, a confidence level and a few keywords), and the
question asks for that JSON. The lengths are bounded so that a complete answer fits in
``MAX_TOKENS`` tokens (a looping small model still ends in valid JSON). Deterministic.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "data" / "SmolLM2-135M-Instruct" / "heldout-questions.jsonl"
OUT = ROOT / "data" / "workloads" / "json.jsonl"
SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 32},
        "answer": {"type": "string", "maxLength": 160},
        "confidence": {"enum": ["low", "medium", "high"]},
        "keywords": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["topic", "answer", "confidence", "keywords"],
    "additionalProperties": False,
}
MAX_TOKENS = 512  # > every bounded field at one character a token, keys included
ASK = ("\n\nReply in JSON with the keys topic, answer (a short answer), confidence (low, medium "
       "or high) and keywords (up to three).")


def rows() -> list[dict]:
    fmt = {"type": "json_schema",
           "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    out = []
    for line in SOURCE.read_text(encoding="utf-8").splitlines():
        q = json.loads(line)
        out.append({"question_id": f"json-{q['question_id']:02d}", "category": "json",
                    "turns": [q["turns"][0] + ASK], "response_format": fmt})
    return out


def main(out: str = str(OUT)) -> None:
    data = rows()
    Path(out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data),
                         encoding="utf-8")
    print(f"wrote {len(data)} rows to {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
