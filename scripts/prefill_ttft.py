"""Time to the first token of one long prompt, no prefix reuse: what the prefill costs.

Usage: python scripts/prefill_ttft.py [WORDS] [ROUNDS] [DTYPE] — the prompt is the README's and
the design document's first ``WORDS`` words (default 1000) and a question; ``ROUNDS`` (default
4) generations of one token on the demo model loaded with ``DTYPE`` (default ``auto``: its 4-bit
weights), each with a fresh engine without prefix reuse (every prompt token is scored). Prints the
prompt's token count and each round's milliseconds, then their median. Run it on a quiet
machine, or against another build taking turns (process by process).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)

from edgespec.engine import Engine
from edgespec.targets import load

ROOT = Path(__file__).resolve().parents[1]


def prompt_text(words: int) -> str:
    text = " ".join((ROOT / "README.md").read_text().split() +
                    (ROOT / "docs" / "architecture.md").read_text().split())
    return " ".join(text.split()[:words]) + "\n\nWhat does this project do, in one sentence?"


def main(words: str = "1000", rounds: str = "4", dtype: str = "auto") -> None:
    target = load("demo", dtype=dtype, progress=False)
    chat = [{"role": "user", "content": prompt_text(int(words))}]
    Engine(target, None, reuse_prefix=False).generate(chat, max_tokens=1)  # first-call costs
    times = []
    for _ in range(int(rounds)):
        engine = Engine(target, None, reuse_prefix=False)
        t = time.perf_counter()
        engine.generate(chat, max_tokens=1)
        times.append((time.perf_counter() - t) * 1e3)
    tokens = len(Engine(target, None).encode(chat))
    print(f"prompt {tokens} tokens; first token " + ", ".join(f"{t:.0f}" for t in times)
          + f" ms; median {statistics.median(times):.0f} ms")


if __name__ == "__main__":
    main(*sys.argv[1:])
