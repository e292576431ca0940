"""Where a round of several clients' decodings goes, and the throughput its forward alone allows.

Usage: python scripts/batch_anatomy.py [--clients 4] [--prompts 16] [--max-tokens 128]
[--configs auto:shared,eagle3:shared,eagle3:full,none:shared] — for each configuration
(``method:policy``), ``c`` closed-loop clients send MT-bench prompts (``../shared/eval``, read
only to measure) through the worker, as ``scripts/concurrency.py`` does, and the batch's rounds
are timed by wrappers around ``Batch.round`` and ``Batch._score``. Only rounds in which all
``c`` decodings were running and stayed count (a join's prefill, a leave or the run's ragged end
is not the steady state being sized).

Per configuration: the rounds counted, ms per round, committed tokens per round, the shared
forward's ms (waited for inside the wrapper: the acceptance walk waits for it anyway) and rows,
the forwards run alone (prefill chunks of joining requests, waited for likewise) per round, the
rest of the round (``host``: drafting, acceptance, text, building the graphs), and
``forwards-only``: tokens per round over the forwards' ms, the throughput these rounds would
give if everything but the target's forwards cost nothing. Against the serial throughput
(``auto`` at one client, measured first; its prefills are in it too), it bounds what any
host-side work can reach at ``c`` clients.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
import mlx.core as mx

from edgespec import batch as batch_module
from edgespec.targets import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from concurrency import eval_prompts, run  # noqa: E402


class Timed:
    """Wraps ``Batch.round``, ``Batch._score`` and ``Batch._answer`` while it is entered;
    ``counts`` holds the sums over the rounds in which ``clients`` decodings ran throughout."""

    def __init__(self, clients: int):
        self.clients, self.counts = clients, Counter()
        B = batch_module.Batch
        self._round, self._score, self._answer = B.round, B._score, B._answer
        self._forward: tuple[float, int] = (0.0, 0)
        self._alone, self._scoring = 0.0, False

    def __enter__(self):
        timed = self

        def score(batch, group, events):
            t0, timed._scoring = time.perf_counter(), True  # a group of one is answered alone
            try:
                out = timed._score(batch, group, events)
            finally:
                timed._scoring = False
            mx.eval([s.sent.logits for s, _ in group
                     if s.sent is not None and s.sent.logits is not None])
            ms, rows = timed._forward
            timed._forward = (ms + time.perf_counter() - t0,
                              rows + sum(len(n.part.ids) for _, n in group))
            return out

        def answer(batch, slot, run, events):
            t0 = time.perf_counter()
            out = timed._answer(batch, slot, run, events)
            if not timed._scoring:
                if slot.sent is not None:
                    mx.eval(slot.sent.hidden)
                timed._alone += time.perf_counter() - t0
            return out

        def round_(batch):
            n, t0 = len(batch.slots), time.perf_counter()
            timed._forward, timed._alone = (0.0, 0), 0.0
            events = timed._round(batch)
            if n == timed.clients and len(batch.slots) == n:
                c = timed.counts
                c["rounds"] += 1
                c["round_s"] += time.perf_counter() - t0
                c["forward_s"] += timed._forward[0]
                c["rows"] += timed._forward[1]
                c["alone_s"] += timed._alone
                c["tokens"] += sum(len(e.token_ids) for _, e in events if hasattr(e, "token_ids"))
            return events

        B = batch_module.Batch
        B.round, B._score, B._answer = round_, score, answer
        return self

    def __exit__(self, *exc):
        B = batch_module.Batch
        B.round, B._score, B._answer = self._round, self._score, self._answer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--configs", default="auto:shared,eagle3:shared,eagle3:full,none:shared")
    a = ap.parse_args()
    target = load(a.model, dtype=a.dtype, progress=False)
    prompts = eval_prompts(target, a.prompts)
    configs = [tuple(c.split(":")) for c in a.configs.split(",")]
    for method in {m for m, _ in configs} | {"auto"}:  # warm-up: kernels, curve, heads
        run(target, method, "shared", 2, prompts[:2], 8)
    serial = run(target, "auto", "shared", 1, prompts, a.max_tokens)["tok_s"]
    print(f"serial (auto, 1 client): {serial:.1f} tok/s; {a.clients} clients, rounds with all "
          f"{a.clients} running:", flush=True)
    print("config         tok/s  rounds  ms/round  tokens/round  shared forward ms  rows  "
          "alone ms  host ms  forwards-only tok/s (x serial)")
    for method, policy in configs:
        with Timed(a.clients) as t:
            r = run(target, method, policy, a.clients, prompts, a.max_tokens)
        c = t.counts
        k = max(1, c["rounds"])
        fwd_ms, round_ms = 1e3 * c["forward_s"] / k, 1e3 * c["round_s"] / k
        alone_ms = 1e3 * c["alone_s"] / k
        bound = c["tokens"] / max(c["forward_s"] + c["alone_s"], 1e-9)
        print(f"{method + ':' + policy:14} {r['tok_s']:6.1f}  {c['rounds']:6}  {round_ms:8.1f}  "
              f"{c['tokens'] / k:12.2f}  {fwd_ms:17.1f}  {c['rows'] / k:4.1f}  {alone_ms:8.1f}  "
              f"{round_ms - fwd_ms - alone_ms:7.1f}  {bound:6.1f} ({bound / serial:.2f})",
              flush=True)


if __name__ == "__main__":
    main()
