"""What the MTP drafter costs beside the target, on a hybrid model sized like the demo.

    python scripts/mtp_cost.py [--layers 28] [--steps 30] [--json out.json]

The model: ``recurrent_rollback.py``'s demo-width Qwen3.5 (``DEMO_HYBRID``, random weights,
float32) with a random MTP layer in the published layout (one gated-attention layer + the shared
49152-token head). After a 200-token prefill (target and MTP layer alike), per draft length k:

- verify(k): the target scoring a chain of k+1 nodes (forward + readback), from the same history;
- draft: one MTP row (fc, the layer over its own cache, ``mtp.norm``, the head, argmax);
- feed(m): the accepted path's m+1 true pairs fed to the MTP cache (here m = k: all accepted).

Reported: the medians in ms, the share of a plain step (verify(0)) one draft row costs, and the
break-even per-token acceptance a of each k, where a chain's expected committed tokens
(1 - a^(k+1)) / (1 - a) over its step cost (verify(k) + (k-1) drafts after the first, which
comes with the feed, + feed(k)) equals plain decoding's 1 / verify(0). Random weights: no
acceptance is measured here; only a real checkpoint's MTP layer says what it accepts.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import edgespec  # noqa: F401  (first: it loads the optimized BLAS before MLX starts)
import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))
from recurrent_rollback import build  # noqa: E402

from edgespec.targets.mtp import MtpModel, mtp_block  # noqa: E402
from edgespec.targets.target import Target  # noqa: E402


def timed(fn, steps: int) -> float:
    out = []
    for _ in range(steps + 2):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out[2:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json")
    a = ap.parse_args()
    target = build(a.layers)
    layer = MtpModel(target.args, mtp_block(target, experts=False), target.model)
    mx.eval(layer.parameters())
    mtp = Target(layer, tokenizer=None, dtype="float32")
    ids = [int(t) for t in mx.random.randint(3, 49000, (201,)).tolist()]
    cache = target.make_cache()
    out = target.score(ids[:200], cache, head=False)
    cache.commit()
    h = target.model.model.norm(out.hidden)
    pairs = mtp.make_cache()
    rows = mx.array(ids[1:201])
    mtp.score(rows, pairs, hidden=layer.fuse_input(rows, h), head=False)
    pairs.commit()
    mx.eval(cache.state(), pairs.state())

    def verify(k: int) -> None:
        mx.eval(target.score(ids[200:201] + [5] * k, cache).logits)
        cache.trim(0)  # nothing committed: the scratch is rewritten next time

    def draft() -> None:
        o = mtp.score(mx.array([7]), pairs, hidden=layer.fuse_input(mx.array([7]), h[-1:]),
                      head=False)
        mx.argmax(layer.head(layer.model.norm(o.hidden))).item()

    def feed(m: int) -> None:
        t = mx.array([9] * (m + 1))
        o = mtp.score(t, pairs, hidden=layer.fuse_input(t, h[-m - 1:]), head=False)
        pairs.commit()
        mx.eval(layer.head(layer.model.norm(o.hidden[-1:])), pairs.state())
        pairs.trim(m + 1)

    plain, row = timed(lambda: verify(0), a.steps), timed(draft, a.steps)
    table = []
    for k in (1, 2, 3, 4, 6):
        v, f = timed(lambda: verify(k), a.steps), timed(lambda: feed(k), a.steps)
        step = v + (k - 1) * row + f
        lo, hi = 0.0, 1.0
        for _ in range(50):  # break-even acceptance: expected tokens / step = 1 / plain
            mid = (lo + hi) / 2
            tokens = sum(mid**i for i in range(k + 1))
            lo, hi = (lo, mid) if tokens / step > 1 / plain else (mid, hi)
        table.append({"k": k, "verify_ms": v, "feed_ms": f, "step_ms": step, "break_even": hi})
    print(f"plain step {plain:.2f} ms; one MTP draft row {row:.2f} ms "
          f"({100 * row / plain:.0f}% of a plain step)")
    print("k  verify(k)  feed(k)  step    break-even acceptance")
    for r in table:
        print(f"{r['k']}  {r['verify_ms']:8.2f}  {r['feed_ms']:7.2f}  {r['step_ms']:6.2f}  "
              f"{r['break_even']:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"machine": platform.processor() or platform.machine(),
                                            "layers": a.layers, "plain_ms": plain,
                                            "draft_row_ms": row, "chains": table}, indent=1))


if __name__ == "__main__":
    main()
