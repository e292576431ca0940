"""How long the kernels' helper threads poll for the next job, against decoding speed, in one
process.

Usage: python scripts/pool_spin_ab.py [SPINS] [ROUNDS] [METHOD] [MODEL] [DTYPE] — SPINS are
microseconds (comma-separated, default ``40,100``; the first is the baseline), each round
decodes 128 greedy tokens of a short story once per setting (``native.set_pool_spin_us``), the
settings' order reversed every other round so a drifting machine favours none; METHOD (default
``none``: plain decoding) is any method name, with a fresh drafter per run; MODEL (default
``demo``) loaded with DTYPE (default ``auto``). Prints each setting's median tokens/s and, against
the baseline, the median of the rounds' paired ratios and how many rounds it was faster. The
results are the same bits whatever the setting (tests/test_pool_spin.py). Run it on a quiet
machine.
"""

from __future__ import annotations

import statistics
import sys
import time

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
from edgespec.config import SamplingConfig
from edgespec.drafters import make_drafter
from edgespec.engine import Engine
from edgespec.kernels import native
from edgespec.options import spec_for
from edgespec.targets import load

CHAT = [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds "
                                    "a message in a bottle."}]


def main(spins: str = "40,100", rounds: str = "12", method: str = "none", model: str = "demo",
         dtype: str = "auto") -> None:
    module = native.load()
    if module is None:
        sys.exit(f"pool_spin_ab: the native kernels are not loaded: {native.status().reason}")
    target = load(model, dtype=dtype, progress=False)

    def engine() -> Engine:
        drafter = None if method == "none" else make_drafter(spec_for(method, {}), target,
                                                             SamplingConfig())
        return Engine(target, drafter)

    for _ in engine().stream(CHAT, max_tokens=16):  # warm-up: first-call allocations
        pass
    settings = [int(s) for s in spins.split(",")]
    rates: dict[int, list[float]] = {s: [] for s in settings}
    before = module.pool_spin_us()
    try:
        for r in range(int(rounds)):
            for s in settings if r % 2 == 0 else settings[::-1]:
                module.set_pool_spin_us(s)
                start, tokens = time.perf_counter(), 0
                for step in engine().stream(CHAT, max_tokens=128):
                    tokens += len(step.token_ids)
                rates[s].append(tokens / (time.perf_counter() - start))
    finally:
        module.set_pool_spin_us(before)
    base = settings[0]
    for s, v in rates.items():
        line = f"{method} polling {s:>6} us: median {statistics.median(v):6.1f} tok/s"
        if s != base:
            ratios = [a / b for a, b in zip(v, rates[base])]
            line += (f"; against {base} us: median paired ratio {statistics.median(ratios):.3f}, "
                     f"faster in {sum(x > 1 for x in ratios)}/{len(ratios)} rounds")
        print(line)


if __name__ == "__main__":
    main(*sys.argv[1:])
