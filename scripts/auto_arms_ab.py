"""auto as built against auto with an arm put back, and each method alone, in one process.

Usage: python scripts/auto_arms_ab.py PROMPTS [LIMIT] [DTYPE] [VARIANTS] [MODEL] — MODEL (as
``edgespec --model`` takes it; default ``demo``, or a GGUF file such as ``vs_llama_cpp.py``'s
q8_0 copy) loaded with ``DTYPE`` (as ``edgespec --dtype`` takes it; default ``auto``: a GGUF's
own 4- or 8-bit weights) decodes 128 greedy tokens for the first ``LIMIT`` (default 24) prompts
of a bench prompts file, each prompt by every variant in turn (comma-separated; default
``none,corpus,auto,auto+plain``):

- a method by its name, with a fresh drafter as in ``edgespec bench``;
- ``auto+plain``: the method ``auto`` with a plain-decoding arm put back where
  ``registry._auto`` left it out (its arms gate themselves);
- ``auto+eagle3``: auto as ``registry._auto`` builds it on a flat verify-cost curve (its
  EAGLE-3 arm kept however steep the measured curve is: ``registry.STEEP_RATIO``).

Every output is checked against plain decoding's. Prints each variant's decoding tokens/s
(prefill not counted) over plain decoding's, overall and per category, and τ. Measure on the
repository's workloads (``data/workloads``), not the evaluation prompts.
"""

from __future__ import annotations

import math
import sys

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
from edgespec import Engine, load_target, make_drafter
from edgespec.bench import load_prompts
from edgespec.bench_rows import generate_row
from edgespec.config import GenerationConfig, SamplingConfig
from edgespec.drafters import registry
from edgespec.drafters.auto import PLAIN, AutoDrafter
from edgespec.options import spec_for


def drafter_for(variant: str, target):
    method = variant.removesuffix("+plain").removesuffix("+eagle3")
    steep = registry.STEEP_RATIO
    if variant.endswith("+eagle3"):
        registry.STEEP_RATIO = math.inf
    try:
        drafter = make_drafter(spec_for(method, {}), target, SamplingConfig())
    finally:
        registry.STEEP_RATIO = steep
    if variant.endswith("+plain") and PLAIN not in drafter.arms:
        drafter = AutoDrafter({PLAIN: None, **drafter.arms})
    return drafter


def main(prompts_file: str, limit: str = "24", dtype: str = "auto",
         variants: str = "none,corpus,auto,auto+plain", model: str = "demo") -> None:
    names = variants.split(",")
    assert names[0] == "none", "plain decoding first: the others are checked against it"
    target = load_target(model, dtype=dtype)
    generation = GenerationConfig(128)
    sums: dict[str, dict[str, list[float]]] = {}  # category -> variant -> [tokens, s, steps]
    for p in load_prompts(prompts_file, limit=int(limit)):
        plain = None
        for name in names:
            drafter = None if name == "none" else drafter_for(name, target)
            r = generate_row(Engine(target, drafter, SamplingConfig()), p, False, generation)
            plain = r.token_ids if plain is None else plain
            assert r.token_ids == plain, f"{name} differs from plain decoding on {p.id}"
            for cat in ("overall", p.category):
                s = sums.setdefault(cat, {n: [0, 0.0, 0] for n in names})[name]
                s[0] += r.stats.generated_tokens
                s[1] += r.stats.decode_s
                s[2] += r.stats.target_forwards
    print("| category | " + " | ".join(names[1:]) + " | plain tok/s |")
    print("|---|" + "---:|" * len(names))
    for cat, by in sums.items():
        base = by["none"][0] / by["none"][1]
        cells = [f"{t / s / base:.3f}× (τ {t / max(n, 1):.2f})" for t, s, n in
                 (by[name] for name in names[1:])]
        print(f"| {cat} | " + " | ".join(cells) + f" | {base:.1f} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
