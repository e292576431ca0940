"""The decoder blocks built by one native call (``Decoder._stack_for``) against one call per
layer, in one process: forward times, and decoding through the engine.

Usage: python scripts/stack_ab.py [DTYPE] [ROUNDS] [PROMPTS] [LIMIT] [METHODS] — the demo model
loaded with ``DTYPE`` (default ``auto``: its 4-bit weights). First, after a 128-token context,
a forward (build, evaluation and LM head, as ``Target.score`` then ``mx.eval``) over a 1, 2, 4
and 8-node tree, each way in turn, ``ROUNDS`` rounds (default 40; the order alternates), and
the median ms of each with what the stack saves. Then every method of ``METHODS`` (default
``none,corpus,eagle3``) decodes the first ``LIMIT`` (default 12) questions of ``PROMPTS``
(default ``data/workloads/simuser_test.jsonl``, spread over the file) with 128 greedy tokens,
each question both ways in turn (the order alternating), through a step loop engine for the
methods that draft and the pipelined one for ``none``: decoding tokens/s each way, their ratio
and whether every output was the same. Run it on a quiet machine.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
import mlx.core as mx

from edgespec.config import SamplingConfig
from edgespec.drafters import make_drafter
from edgespec.engine import Engine
from edgespec.options import spec_for
from edgespec.targets import load
from edgespec.targets.cost import primed_cache
from edgespec.targets.decoder import Decoder
from edgespec.tree import DraftTree

ROOT = Path(__file__).resolve().parents[1]
STACK = Decoder._stack_for
WAYS = {"per-layer": lambda *a: None, "stack": STACK}
SIZES = (1, 2, 4, 8)


def way(name: str) -> None:
    Decoder._stack_for = WAYS[name]


def forwards(target, rounds: int) -> None:
    cache, ids = primed_cache(target, 128, max(SIZES))
    times = {(w, n): [] for w in WAYS for n in SIZES}
    for r in range(rounds + 1):  # round 0 warms up
        for n in SIZES:
            tree = DraftTree(ids[128 : 128 + n], [-1] + [(i - 1) // 2 for i in range(1, n)])
            for w in list(WAYS)[:: 1 if r % 2 else -1]:
                way(w)
                t = time.perf_counter()
                mx.eval(target.score(tree, cache).logits)
                if r:
                    times[w, n].append((time.perf_counter() - t) * 1e3)
    way("stack")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"forward ms after 128 tokens, median of {rounds} rounds:")
    for w in WAYS:
        print(f"{w:>10} " + " ".join(f"{n}: {med[w, n]:6.2f}" for n in SIZES))
    print(f"{'saved':>10} " + " ".join(f"{n}: {med['per-layer', n] - med['stack', n]:6.2f}"
                                         for n in SIZES))


def decoding(target, prompts: str, limit: int, methods: list[str]) -> None:
    rows = [json.loads(line) for line in Path(prompts).read_text().splitlines() if line.strip()]
    rows = rows[:: max(1, len(rows) // limit)][:limit]

    def engine(method: str) -> Engine:
        if method == "none":
            return Engine(target, None)
        return Engine(target, make_drafter(spec_for(method, {}), target, SamplingConfig()))

    for method in methods:
        engine(method).generate([{"role": "user", "content": rows[0]["turns"][0]}], max_tokens=32)
        done = {w: [0, 0.0] for w in WAYS}
        same = True
        for k, row in enumerate(rows):
            chat = [{"role": "user", "content": row["turns"][0]}]
            got = []
            for w in list(WAYS)[:: 1 if k % 2 else -1]:
                way(w)
                res = engine(method).generate(chat, max_tokens=128)
                done[w][0] += res.stats.generated_tokens
                done[w][1] += res.stats.decode_s
                got.append(res.token_ids)
            same = same and got[0] == got[1]
        way("stack")
        rate = {w: n / s for w, (n, s) in done.items()}
        print(f"{method:>8}: per-layer {rate['per-layer']:.1f} tok/s, stack {rate['stack']:.1f} "
              f"tok/s, {rate['stack'] / rate['per-layer']:.3f}x; outputs identical: {same}")


def main(dtype: str = "auto", rounds: str = "40",
         prompts: str = str(ROOT / "data" / "workloads" / "simuser_test.jsonl"),
         limit: str = "12", methods: str = "none,corpus,eagle3") -> None:
    target = load("demo", dtype=dtype, progress=False)
    forwards(target, int(rounds))
    decoding(target, prompts, int(limit), methods.split(","))


if __name__ == "__main__":
    main(*sys.argv[1:])
