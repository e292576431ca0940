"""How much the verify-cost curve moves between measurements, and whether the sizing cares.

Usage: python scripts/cost_curve_repeat.py [REPEATS] [DTYPE] [PROMPTS] [LIMIT] — measures the
demo model's curve (``targets/cost.measure_cost_curve``, as a first run on a machine does;
``DTYPE`` as ``edgespec --dtype`` takes it, default ``auto``) ``REPEATS`` times (default 4) in
one process and prints each with its 2/1, 4/1 and 8/1 ratios. With ``PROMPTS`` (a bench prompts
file; use the repository's workloads), the first ``LIMIT`` (default 24) prompts are then decoded
(128 greedy tokens, each prompt by every variant in turn) by plain decoding, and by the corpus
and EAGLE-3 drafters sized on the flattest and on the steepest of those curves (by 4/1); prints
decoding tokens/s over plain decoding's, and τ.
"""

from __future__ import annotations

import sys

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
from edgespec import Engine, load_target, make_drafter
from edgespec.bench import load_prompts
from edgespec.bench_rows import generate_row
from edgespec.config import GenerationConfig, SamplingConfig
from edgespec.options import spec_for
from edgespec.targets.cost import measure_cost_curve


def main(repeats: str = "4", dtype: str = "auto", prompts: str | None = None,
         limit: str = "24") -> None:
    target = load_target("demo", dtype=dtype)
    curves = []
    for _ in range(int(repeats)):
        c = measure_cost_curve(target)
        curves.append(c)
        r = [c.ms(n) / c.ms(1) for n in (2, 4, 8)]
        print(" ".join(f"{n}: {c.ms(n):.2f}" for n in (1, 2, 3, 4, 6, 8, 16)),
              "ms   2/1 %.2f  4/1 %.2f  8/1 %.2f" % tuple(r))
    if prompts is None:
        return
    flat, steep = (min(curves, key=lambda c: c.ms(4) / c.ms(1)),
                   max(curves, key=lambda c: c.ms(4) / c.ms(1)))
    variants = {f"{m}, {k}": (m, c) for m in ("corpus", "eagle3")
                for k, c in (("flattest", flat), ("steepest", steep))}
    sums = {name: [0, 0.0, 0] for name in ("none", *variants)}
    for p in load_prompts(prompts, limit=int(limit)):
        plain = None
        for name in sums:
            drafter = None
            if name != "none":
                method, curve = variants[name]
                drafter = make_drafter(spec_for(method, {}), target, SamplingConfig())
                drafter.curve = curve
            r = generate_row(Engine(target, drafter, SamplingConfig()), p, False,
                             GenerationConfig(128))
            plain = r.token_ids if plain is None else plain
            assert r.token_ids == plain, f"{name} differs from plain decoding on {p.id}"
            s = sums[name]
            s[0], s[1], s[2] = (s[0] + r.stats.generated_tokens, s[1] + r.stats.decode_s,
                                s[2] + r.stats.target_forwards)
    base = sums["none"][0] / sums["none"][1]
    for name, (t, s, n) in sums.items():
        print(f"{name}: {t / s / base:.3f}x (tau {t / max(n, 1):.2f})")


if __name__ == "__main__":
    main(*sys.argv[1:])
