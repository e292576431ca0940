"""Gemma 3's blocks as the native sandwich block against the module path they ran before, in one
process, taking turns.

Usage: python scripts/sandwich_ab.py [MODEL] [DTYPE] [ROUNDS] [TOKENS] — default gemma3-270m,
``auto`` (kept quantized), 3 rounds, 64 tokens a prompt over four completion prompts (the 270M
file is a base model). Variants:

- ``module``: every block's fused form set aside (``_fused = None``), as before the sandwich
  block: the module path, float x;
- ``native, float x``: the native blocks with int8 activations off
  (``EDGESPEC_Q8_ACTIVATIONS=0``'s setting);
- ``native``: as edgespec runs it (kept quantized: int8 x where the CPU has the code).

Prints each variant's plain-decoding tok/s per round, the medians of the paired ratios against
``module``, and how many outputs equal ``module``'s (int8 x rounds differently, so greedy output
may differ; the float-x native block should give the module path's tokens). Then the time to
the first token of a ~1,000-word prompt (``scripts/prefill_ttft.py``'s, as raw text; no prefix
reuse) per variant, taking turns: the module path prefills in chunks of 512 tokens, the native
blocks in chunks of 32.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)

from edgespec.engine import Engine
from edgespec.kernels.backend import set_q8_activations
from edgespec.targets import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prefill_ttft import prompt_text  # noqa: E402  (sibling scripts)
from widen_ab import PROMPTS, decode  # noqa: E402


def main(model: str = "gemma3-270m", dtype: str = "auto", rounds: str = "3",
         tokens: str = "64") -> None:
    target = load(model, dtype=dtype, progress=False)
    blocks = target.model.model.layers
    fused = [b._fused for b in blocks]
    assert target.model.native_blocks(), "this model's blocks have no native form here"

    def variant(name: str) -> None:
        for b, f in zip(blocks, fused):
            b._fused = None if name == "module" else f
        set_q8_activations(False if name == "native, float x" else None)

    names = ["module", "native, float x", "native"]
    speeds: dict[str, list[float]] = {v: [] for v in names}
    outs: dict[str, list] = {}
    for r in range(int(rounds)):
        for name in names:
            variant(name)
            speed, out = decode(target, int(tokens))
            speeds[name].append(speed)
            outs.setdefault(name, out)
        print(f"round {r + 1}: " + ", ".join(f"{n} {speeds[n][-1]:.1f}" for n in names)
              + " tok/s")
    prompt = prompt_text(1000)
    firsts: dict[str, list[float]] = {v: [] for v in names}
    for _ in range(int(rounds)):
        for name in names:
            variant(name)
            engine = Engine(target, None, reuse_prefix=False)
            t0 = time.perf_counter()
            engine.generate(prompt, max_tokens=1)
            firsts[name].append((time.perf_counter() - t0) * 1e3)
    variant("native")
    print(f"first token of a {len(Engine(target).encode(prompt))}-token prompt (ms, median): "
          + ", ".join(f"{n} {statistics.median(firsts[n]):.0f}" for n in names))
    for name in names:
        ratios = [a / b for a, b in zip(speeds[name], speeds["module"])]
        same = sum(a == b for a, b in zip(outs[name], outs["module"]))
        each = ", ".join(f"{x:.2f}" for x in ratios)
        print(f"{name:16s} median {statistics.median(speeds[name]):6.1f} tok/s, "
              f"x module {statistics.median(ratios):.2f} (rounds {each}), "
              f"outputs equal to module's {same}/{len(PROMPTS)}")


if __name__ == "__main__":
    main(*sys.argv[1:])
