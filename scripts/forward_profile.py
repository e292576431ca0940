"""Where does a target forward's time go? 1/2/4/8/16-token forwards of a model, split.

Usage: python scripts/forward_profile.py [MODEL] [ROUNDS] [ab|-] [DTYPE] — after a 128-token
context, times the whole forward (body + LM head), the body alone and the LM head alone for N =
1, 2, 4, 8, 16 tokens. The sizes are interleaved round by round, so slow drift on a shared machine affects
all of them alike; medians and minima over the rounds are printed. With ``ab``, every case is
timed with the native kernels on and off (``kernels/backend.set_native_enabled``), the two
paired within the round and their order alternating from round to round; the table then has a
column per variant and their ratio (``-``: one variant). ``DTYPE``: the weights' dtype as
``edgespec --dtype`` takes it (``auto`` keeps a GGUF's or checkpoint's quantization); the
default is the loader's. Run it on a quiet machine.
"""

from __future__ import annotations

import statistics
import sys
import time

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
import mlx.core as mx

from edgespec.kernels import backend
from edgespec.targets import load

CONTEXT, SIZES = 128, (1, 2, 4, 8, 16)
PARTS = ("forward", "body", "head")


def timed(fn) -> float:
    t = time.perf_counter()
    mx.eval(fn())
    return (time.perf_counter() - t) * 1e3


def main(ref: str = "demo", rounds: str = "25", mode: str = "", dtype: str | None = None) -> None:
    variants = {"native": True, "mlx": False} if mode == "ab" else {"": backend.native_enabled()}
    target = load(ref, dtype=dtype, progress=False)
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
        for on in variants.values():  # warm up (compiles the small-input functions per variant)
            backend.set_native_enabled(on)
            for fn in cases[n].values():
                timed(fn)
    times = {(v, n, part): [] for v in variants for n in SIZES for part in PARTS}
    for r in range(int(rounds)):
        order = list(variants.items())[:: 1 if r % 2 == 0 else -1]
        for n in SIZES:
            for v, on in order:
                backend.set_native_enabled(on)
                for part, fn in cases[n].items():
                    times[v, n, part].append(timed(fn))
    backend.set_native_enabled(True)
    med = {key: statistics.median(ts) for key, ts in times.items()}
    print(f"median of {rounds} rounds, ms; kernels: {backend.native_summary()}")
    for v in variants:
        label = f" [{v}]" if v else ""
        print(f"{'tokens':>6} {'forward':>9} {'(min)':>7} {'body':>7} {'head':>6}{label}")
        base = med[v, 1, "forward"]
        for n in SIZES:
            print(f"{n:>6} {med[v, n, 'forward']:>9.1f} {min(times[v, n, 'forward']):>7.1f} "
                  f"{med[v, n, 'body']:>7.1f} {med[v, n, 'head']:>6.1f}   x{med[v, n, 'forward'] / base:.2f}")
    if len(variants) == 2:
        print("native / mlx, per round paired (median of the per-round ratios):")
        for n in SIZES:
            ratios = {p: statistics.median(a / b for a, b in zip(times["native", n, p], times["mlx", n, p]))
                      for p in PARTS}
            print(f"{n:>6} " + "  ".join(f"{p} {ratios[p]:.2f}" for p in PARTS))


if __name__ == "__main__":
    main(*sys.argv[1:])
