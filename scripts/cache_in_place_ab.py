"""The native stack writing the caches in place against the slice updates, in one process.

Usage: python scripts/cache_in_place_ab.py [PROMPTS] [LIMIT] [METHODS] [MODEL] [DTYPE] — MODEL
(default ``demo``) loaded with DTYPE (default ``auto``: a GGUF's own 4- or 8-bit weights)
decodes 128 greedy tokens for the first LIMIT (default 16) prompts of a bench prompts file
(default the held-out questions, ``data/SmolLM2-135M-Instruct/heldout-questions.jsonl``), with
each method of METHODS (comma-separated, default ``none,eagle3,corpus``; ``none``: plain
decoding, pipelined) twice in turn: its forwards writing the cache in place (as built), and by
``DecoderBlocks``' slice updates (``KVCache.in_place_buffers`` answering no). The two variants'
order alternates from prompt to prompt. Every output of both is checked against plain decoding
with the slice updates. Prints per method each variant's tokens/s over the decoding (the first
step, which holds the prefill, not counted), the median of the prompts' paired ratios and how
many prompts were faster in place. Run it on a quiet machine.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
from edgespec import Engine, load_target, make_drafter
from edgespec.bench import load_prompts
from edgespec.cache import KVCache
from edgespec.config import SamplingConfig
from edgespec.options import spec_for

HELD_OUT = Path(__file__).resolve().parents[1] / "data" / "SmolLM2-135M-Instruct" / \
    "heldout-questions.jsonl"
IN_PLACE = KVCache.in_place_buffers


def slice_updates(cache: KVCache):
    """``KVCache.in_place_buffers`` answering no: every stack forward as before the writes."""
    return False, IN_PLACE(cache)[1]


VARIANTS = {"in place": IN_PLACE, "slice updates": slice_updates}


def decode(target, method: str, text: str, variant: str) -> tuple[float, list[int]]:
    """128 greedy tokens; returns tokens/s after the first step, and every token."""
    KVCache.in_place_buffers = VARIANTS[variant]
    try:
        drafter = None if method == "none" else make_drafter(spec_for(method, {}), target,
                                                             SamplingConfig())
        start, first, tokens = None, 0, []
        for step in Engine(target, drafter).stream([{"role": "user", "content": text}],
                                                   max_tokens=128):
            if start is None:
                start, first = time.perf_counter(), len(step.token_ids)
            tokens += step.token_ids
        return (len(tokens) - first) / (time.perf_counter() - start), tokens
    finally:
        KVCache.in_place_buffers = IN_PLACE


def main(prompts: str = str(HELD_OUT), limit: str = "16", methods: str = "none,eagle3,corpus",
         model: str = "demo", dtype: str = "auto") -> None:
    target = load_target(model, dtype=dtype)
    items = load_prompts(prompts, limit=int(limit))
    names = methods.split(",")
    decode(target, "none", items[0].text, "in place")  # warm-up: first-call allocations
    rates = {(m, v): [] for m in names for v in VARIANTS}
    for i, p in enumerate(items):
        plain = decode(target, "none", p.text, "slice updates")[1]
        for m in names:
            for v in (list(VARIANTS) if i % 2 == 0 else list(VARIANTS)[::-1]):
                rate, tokens = decode(target, m, p.text, v)
                if tokens != plain:
                    sys.exit(f"cache_in_place_ab: {m} ({v}) differs from plain decoding on "
                             f"prompt {i}")
                rates[m, v].append(rate)
    for m in names:
        base = rates[m, "slice updates"]
        for v in VARIANTS:
            got = rates[m, v]
            pairs = [a / b for a, b in zip(got, base)]
            print(f"{m:>8} {v:>13}: {statistics.fmean(got):6.1f} tok/s, median paired "
                  f"{statistics.median(pairs):.3f}, faster in {sum(x > 1 for x in pairs)}/"
                  f"{len(pairs)}")


if __name__ == "__main__":
    main(*sys.argv[1:])
