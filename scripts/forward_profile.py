"""Where does a target forward's time go? 1/2/4/8/16-token forwards of a model, split.

Usage: python scripts/forward_profile.py [MODEL] [ROUNDS] — after a 128-token context, times the
whole forward (body + LM head), the body alone and the LM head alone for N = 1, 2, 4, 8, 16
tokens. The sizes are interleaved round by round, so slow drift on a shared machine affects
all of them alike; medians and minima over the rounds are printed. Run it on a quiet machine.
"""

from __future__ import annotations

import statistics
import sys
import time

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
import mlx.core as mx

from edgespec.targets import load

CONTEXT, SIZES = 128, (1, 2, 4, 8, 16)


def timed(fn) -> float:
    t = time.perf_counter()
    mx.eval(fn())
    return (time.perf_counter() - t) * 1e3


def main(ref: str = "demo", rounds: str = "25") -> None:
    target = load(ref, progress=False)
    cache = target.make_cache()
    ids = [(7 * i) % 1000 + 10 for i in range(CONTEXT + 16)]
    target.score(ids[:CONTEXT], cache, head=False)
    cache.commit()
    mx.eval(cache.state())
    cases = {}
    for n in SIZES:
        toks = mx.array(ids[CONTEXT : CONTEXT + n])

        def body(toks=toks):  # Target.score without the head: mask, positions, layers
            return target.score(toks, cache, head=False).hidden

        hidden = body()
        mx.eval(hidden)
        cases[n] = {"forward": lambda b=body: target.logits(b()), "body": body,
                    "head": lambda h=hidden: target.logits(h)}
        for fn in cases[n].values():  # warm up (compiles the small-input functions)
            timed(fn)
    times = {(n, part): [] for n in SIZES for part in ("forward", "body", "head")}
    for _ in range(int(rounds)):
        for n in SIZES:
            for part, fn in cases[n].items():
                times[n, part].append(timed(fn))
    print(f"{'tokens':>6} {'forward':>9} {'(min)':>7} {'body':>7} {'head':>6}   ms, median of {rounds} rounds")
    base = statistics.median(times[1, "forward"])
    for n in SIZES:
        fwd = statistics.median(times[n, "forward"])
        print(f"{n:>6} {fwd:>9.1f} {min(times[n, 'forward']):>7.1f} "
              f"{statistics.median(times[n, 'body']):>7.1f} {statistics.median(times[n, 'head']):>6.1f}"
              f"   x{fwd / base:.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
