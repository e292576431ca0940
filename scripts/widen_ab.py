"""Plain decoding of a kept-quantized model whose weights have widths the native products lack
(the Gemma 3 270M GGUF: 81 of its products are Q5_0), three ways in one process, taking turns:

- ``mlx``: the file's widths, MLX's own product for the 5-bit layers (``widen_for_native`` off);
- ``widened``: re-packed at 8 bits, every product native, as edgespec runs it;
- ``... float by MLX``: that, with the module path's float32 projections (the file's Q6_K
  layers, dequantized) by MLX's product instead of the native one (``parts.project`` before it
  took ``linear``).

Usage: python scripts/widen_ab.py [MODEL] [ROUNDS] [TOKENS] — default gemma3-270m, 3 rounds, 64
tokens a prompt over four completion prompts (the 270M file is a base model). Prints each
variant's tok/s per round, the medians of the paired ratios, and how many outputs equal the
first variant's (the variants round differently, so greedy output may differ).
"""

from __future__ import annotations

import statistics
import sys
import time

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)

import mlx.nn as nn

from edgespec.engine import Engine
from edgespec.targets import load, parts

project = parts.project

PROMPTS = ["The history of the printing press begins", "def fibonacci(n):",
           "Once upon a time, in a small village by the sea,", "The capital of France is"]


def decode(target, tokens: int) -> tuple[float, list[list[int]]]:
    done, outs, t0 = 0, [], time.perf_counter()
    for prompt in PROMPTS:
        ids = [t for step in Engine(target).stream(prompt, max_tokens=tokens)
               for t in step.token_ids]
        done += len(ids)
        outs.append(ids)
    return done / (time.perf_counter() - t0), outs


def mlx_floats(module, x):
    """``parts.project`` with float layers called as they are (MLX's product)."""
    return project(module, x) if isinstance(module, nn.QuantizedLinear) else module(x)


def main(model: str = "gemma3-270m", rounds: str = "3", tokens: str = "64") -> None:
    loading = sys.modules["edgespec.targets.load"]
    widen = loading.widen_for_native
    loading.widen_for_native = lambda m: {}
    own = load(model, dtype="auto", progress=False)
    loading.widen_for_native = widen
    wide = load(model, dtype="auto", progress=False)
    print(f"{model}: re-packed {wide.model.widened}")
    variants = {"mlx": own, "widened": wide, "... float by MLX": wide}
    speeds: dict[str, list[float]] = {v: [] for v in variants}
    outs: dict[str, list] = {}
    decode(wide, 8)  # warm-up
    for r in range(int(rounds)):
        names = list(variants) if r % 2 == 0 else list(variants)[::-1]
        for name in names:
            if name.endswith("float by MLX"):
                parts.project = mlx_floats
            try:
                speed, outs[name] = decode(variants[name], int(tokens))
            finally:
                parts.project = project
            speeds[name].append(speed)
    base = speeds["mlx"]
    for name, got in speeds.items():
        ratio = statistics.median(g / b for g, b in zip(got, base))
        same = sum(a == b for a, b in zip(outs[name], outs["mlx"]))
        print(f"{name:>18}: " + " ".join(f"{s:6.1f}" for s in got)
              + f" tok/s; x mlx (paired median) {ratio:.2f}; outputs equal {same}/{len(PROMPTS)}")


if __name__ == "__main__":
    main(*sys.argv[1:])
