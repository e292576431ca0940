"""Float16 scales and biases for the native quantized products (``fused_block.half_scales``)
against float32 ones, in one process: the demo model loaded twice, once each way.

Usage: python scripts/half_scales_ab.py [MODEL] [ROUNDS] [PROMPTS] [LIMIT] [METHODS] — MODEL
``demo`` (default; its GGUF's 4-bit weights kept, ``--dtype auto``) or a GGUF's path (the q8_0
copy ``scripts/vs_llama_cpp.py --requantize q8_0`` writes). First the bytes
of weights a one-token forward streams each way; then, after a 128-token context, a forward
(build, evaluation and LM head) over a 1, 2, 4, 8 and 16-node tree, each way in turn, ``ROUNDS``
rounds (default 40; the order alternates), the median ms of each; then every method of
``METHODS`` (default ``none,corpus,eagle3``) decodes the first ``LIMIT`` (default 12) questions
of ``PROMPTS`` (default ``data/workloads/simuser_test.jsonl``, spread over the file) with 128
greedy tokens, each question both ways in turn: tokens/s each way, their ratio, and whether
every output was the same. Run it on a quiet machine.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
import mlx.core as mx

from edgespec.config import SamplingConfig
from edgespec.drafters import make_drafter
from edgespec.engine import Engine
from edgespec.kernels import qmatmul
from edgespec.kernels.matmul import halves
from edgespec.options import spec_for
from edgespec.targets import load
from edgespec.targets.cost import primed_cache
from edgespec.tree import DraftTree

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1, 2, 4, 8, 16)


def targets(model: str) -> dict:
    with mock.patch.object(qmatmul, "half_scales", lambda s, b: None):
        wide = load(model, dtype="auto", progress=False)
        halves(wide.model.output_head())  # made (as none) here, whatever Decoder.fuse did
    return {"float32": wide, "float16": load(model, dtype="auto", progress=False)}


def streamed_mb(target) -> float:
    """The MB of weights a one-token forward reads: the blocks' and the LM head's."""
    h = target.model.output_head()
    read = [h["weight"], *(halves(h) or (h["scales"], h.get("biases")))]
    return (sum(a.nbytes for b in target.model.model.layers for a in b.streamed())
            + sum(a.nbytes for a in read if a is not None)) / 1e6


def forwards(ways: dict, rounds: int) -> None:
    primed = {w: primed_cache(t, 128, max(SIZES)) for w, t in ways.items()}
    times = {(w, n): [] for w in ways for n in SIZES}
    for r in range(rounds + 1):  # round 0 warms up
        for n in SIZES:
            for w in list(ways)[:: 1 if r % 2 else -1]:
                cache, ids = primed[w]
                tree = DraftTree(ids[128 : 128 + n], [-1] + [(i - 1) // 2 for i in range(1, n)])
                t = time.perf_counter()
                mx.eval(ways[w].score(tree, cache).logits)
                if r:
                    times[w, n].append((time.perf_counter() - t) * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"forward ms after 128 tokens, median of {rounds} rounds:")
    for w in ways:
        print(f"{w:>8} scales " + " ".join(f"{n}: {med[w, n]:6.2f}" for n in SIZES)
              + f"   8/1: {med[w, 8] / med[w, 1]:.2f}, 16/1: {med[w, 16] / med[w, 1]:.2f}")


def decoding(ways: dict, prompts: str, limit: int, methods: list[str]) -> None:
    rows = [json.loads(line) for line in Path(prompts).read_text().splitlines() if line.strip()]
    rows = rows[:: max(1, len(rows) // limit)][:limit]
    for method in methods:
        engines = {w: Engine(t, None if method == "none" else
                             make_drafter(spec_for(method, {}), t, SamplingConfig()))
                   for w, t in ways.items()}
        for e in engines.values():
            e.generate([{"role": "user", "content": rows[0]["turns"][0]}], max_tokens=32)
        done = {w: [0, 0.0] for w in ways}
        same = True
        for k, row in enumerate(rows):
            chat = [{"role": "user", "content": row["turns"][0]}]
            got = []
            for w in list(ways)[:: 1 if k % 2 else -1]:
                res = engines[w].generate(chat, max_tokens=128)
                done[w][0] += res.stats.generated_tokens
                done[w][1] += res.stats.decode_s
                got.append(res.token_ids)
            same = same and got[0] == got[1]
        rate = {w: n / s for w, (n, s) in done.items()}
        print(f"{method:>8}: float32 scales {rate['float32']:.1f} tok/s, float16 "
              f"{rate['float16']:.1f} tok/s, {rate['float16'] / rate['float32']:.3f}x; "
              f"outputs identical: {same}")


def main(model: str = "demo", rounds: str = "40",
         prompts: str = str(ROOT / "data" / "workloads" / "simuser_test.jsonl"),
         limit: str = "12", methods: str = "none,corpus,eagle3") -> None:
    ways = targets(model)
    print(" ".join(f"{w} scales: a token reads {streamed_mb(t):.1f} MB of weights;"
                   for w, t in ways.items()))
    forwards(ways, int(rounds))
    decoding(ways, prompts, int(limit), methods.split(","))


if __name__ == "__main__":
    main(*sys.argv[1:])
