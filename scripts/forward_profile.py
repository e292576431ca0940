"""Where does a target forward's time go? 1/2/4/8/16-token forwards of a model, split.

Usage: python scripts/forward_profile.py [MODEL] — times (median of repeats, after a 128-token
context) the whole forward, the forward without the LM head, and the LM head alone, so the cost
curve of verification can be attributed. Run it on a quiet machine.
"""

from __future__ import annotations

import statistics
import sys
import time

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
import mlx.core as mx

from edgespec.models import load
from edgespec.tree import chain_mask

CONTEXT, REPEATS = 128, 15


def median_ms(fn) -> float:
    runs = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        mx.eval(fn())
        runs.append(time.perf_counter() - t)
    return statistics.median(runs[2:]) * 1e3


def main(ref: str = "demo") -> None:
    target = load(ref)
    cache = target.make_cache()
    ids = [(7 * i) % 1000 + 10 for i in range(CONTEXT + 16)]
    cache.reserve(CONTEXT)
    target.forward(ids[:CONTEXT], 0, chain_mask(CONTEXT, cache.key_positions(), 0, None), cache)
    cache.commit()
    mx.eval(cache.state())
    print(f"{'tokens':>6} {'forward':>9} {'no head':>9} {'head':>8}  (ms, median of {REPEATS - 2})")
    base = None
    for n in (1, 2, 4, 8, 16):
        toks = mx.array(ids[CONTEXT : CONTEXT + n])
        mask = chain_mask(n, cache.key_positions(), cache.offset, None)
        mask = None if mask is None else mx.array(mask)

        def body():
            cache.reserve(n)
            return target.model(toks[None], cache.offset, mask, cache)

        hidden = body()
        mx.eval(hidden)
        full = median_ms(lambda: target.model.logits(body()))
        no_head = median_ms(body)
        head = median_ms(lambda: target.model.logits(hidden))
        base = base or full
        print(f"{n:>6} {full:>9.1f} {no_head:>9.1f} {head:>8.1f}   x{full / base:.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
