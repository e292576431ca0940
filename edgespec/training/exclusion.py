"""Never train on evaluation prompts: the filter every training prompt passes through.

``EvalExclusion.from_dir(eval_dir)`` reads every prompt in the evaluation files (jsonl records
with ``turns``, ``prompt``, ``messages`` or ``conversations``) and refuses a training prompt that
equals one after normalisation (case, punctuation, whitespace) or shares a run of ``n`` words
with one. The held-out evaluation prompts are read from ``../shared/eval`` beside the
repository by default, or from ``$EDGESPEC_EVAL_DIR``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

NGRAM = 8


def default_eval_dir() -> Path:
    env = os.environ.get("EDGESPEC_EVAL_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "eval"


def words(text: str) -> list[str]:
    return re.sub(r"[^\w\s]", " ", text.lower()).split()


def prompt_texts(record: dict) -> list[str]:
    """Every human-written text of one record, whatever its layout."""
    texts = [t for t in record.get("turns", []) if isinstance(t, str)]
    for key in ("prompt", "question", "instruction"):
        if isinstance(record.get(key), str):
            texts.append(record[key])
    for msg in record.get("messages", []) + record.get("conversations", []):
        if isinstance(msg, dict):
            content = msg.get("content", msg.get("value"))
            if isinstance(content, str):
                texts.append(content)
    return texts


@dataclass
class EvalExclusion:
    exact: set[str] = field(default_factory=set)
    ngrams: set[tuple[str, ...]] = field(default_factory=set)
    sources: list[str] = field(default_factory=list)
    n: int = NGRAM

    @classmethod
    def from_dir(cls, eval_dir: Path | None = None, n: int = NGRAM) -> EvalExclusion:
        eval_dir = Path(eval_dir) if eval_dir is not None else default_eval_dir()
        ex = cls(n=n)
        if eval_dir.is_dir():
            for path in sorted(eval_dir.rglob("*.jsonl")):
                ex.sources.append(str(path))
                for line in path.read_text().splitlines():
                    if line.strip():
                        for text in prompt_texts(json.loads(line)):
                            ex.add(text)
        return ex

    def add(self, text: str) -> None:
        w = words(text)
        self.exact.add(" ".join(w))
        self.ngrams.update(tuple(w[i : i + self.n]) for i in range(len(w) - self.n + 1))

    def __len__(self) -> int:
        return len(self.exact)

    def overlaps(self, text: str) -> bool:
        """Whether ``text`` equals an evaluation prompt (normalised) or shares n words in a row."""
        w = words(text)
        if " ".join(w) in self.exact:
            return True
        return any(tuple(w[i : i + self.n]) in self.ngrams for i in range(len(w) - self.n + 1))

    def keep(self, text: str) -> bool:
        return not self.overlaps(text)
