"""A speculative step's anatomy through the engine, against the verify-cost curve's prediction.

Usage: python scripts/spec_step_anatomy.py [PROMPTS] [LIMIT] [TOKENS] [DTYPE] [VARIANTS] — for
each variant (comma-separated; default ``none,plain-loop,lookup,eagle3,eagle3:8,eagle3:4,auto``:
plain decoding (pipelined), plain decoding through the step loop (``Engine(pipeline=False)``),
then the methods; ``eagle3:B`` is eagle3 with ``head_bits`` B, 0 = the float head) generates
``TOKENS`` (default 64) greedy tokens for the first ``LIMIT`` (default 4) prompts of a bench
prompts file (default ``../shared/eval/mt_bench.jsonl``, read only to measure), the demo model
loaded with ``DTYPE`` (default ``auto``: its 4-bit weights). The variants run in turn on each
prompt (noise lands on all alike), each with a fresh drafter as in ``edgespec bench``.

Per step, timed by wrappers around the drafter's and the target's calls (each ``Target.score``
waited for, as the acceptance walk waits for it anyway):

- ``window``: from one step event to the next (everything a step costs, detokenizing included);
- ``propose`` / ``score`` / ``update``: the drafter's proposal, the target's forward, the
  drafter's update (the head's forward over the accepted pairs);
- ``other``: window - the three (building the tree's mask, acceptance, the cache commit, emitting);
- ``curve``: ``verify_cost_curve(target).ms(nodes)``: the forward the tree sizing expects;
- ``host``: the CPU time of the engine's thread over the window (``time.thread_time``: Python,
  graph building, the drafter's host work; the kernels run on MLX's and their own threads), a
  figure a loaded machine disturbs less than the wall times. Pipelined plain decoding hides it
  behind the next forward; the step loop cannot.

Prints per variant: tokens per step, tok/s over the windows, and per-step means in ms. Run it on
a quiet machine (``scripts/quantized_step_profile.py`` splits the forward itself).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
import mlx.core as mx

from edgespec.bench import load_prompts
from edgespec.config import SamplingConfig
from edgespec.drafters import make_drafter
from edgespec.engine import Engine
from edgespec.options import spec_for
from edgespec.targets import load
from edgespec.targets.cost import verify_cost_curve

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "shared" / "eval" / "mt_bench.jsonl"
PARTS = ("window", "propose", "score", "update", "other", "curve", "host")


def engine_for(variant: str, target) -> Engine:
    if variant in ("none", "plain-loop"):
        return Engine(target, None, pipeline=variant == "none")
    method, _, bits = variant.partition(":")
    shared = {"head_bits": int(bits)} if bits else {}
    return Engine(target, make_drafter(spec_for(method, shared), target, SamplingConfig()))


def instrument(engine: Engine, curve) -> dict:
    """Wrap the drafter's propose/update and the target's score (on these objects only); returns
    the dict they add each step's parts to (``run`` reads and clears it)."""
    target, drafter, now = engine.target, engine.drafter, {}

    def wrap(obj, name, part, after=None):
        fn = getattr(obj, name)

        def timed(*a, **kw):
            t = time.perf_counter()
            out = fn(*a, **kw)
            if after is not None:
                after(out)
            now[part] = now.get(part, 0.0) + (time.perf_counter() - t) * 1e3
            if part == "score":
                nodes = len(a[0].tokens) if hasattr(a[0], "tokens") else 1
                now["curve"] = now.get("curve", 0.0) + curve.ms(nodes)
                now["nodes"] = nodes
            return out

        setattr(obj, name, timed)

    if engine.drafter is not None or not engine.pipeline:  # waiting would undo the pipelining
        wrap(target, "score", "score", after=lambda out: mx.eval(out.logits))
    if drafter is not None:
        wrap(drafter, "propose", "propose")
        wrap(drafter, "update", "update")
    return now


def run(engine: Engine, now: dict, curve, prompt, tokens: int, steps: list[dict]) -> None:
    t = c = None
    chat = [{"role": "user", "content": prompt.text}]
    for step in engine.stream(chat, max_tokens=tokens):
        t1, c1 = time.perf_counter(), time.thread_time()
        if t is not None:  # the first event ends the prefill and the first step: not counted
            row = {p: now.get(p, 0.0) for p in PARTS if p not in ("window", "host")}
            row["window"], row["host"] = (t1 - t) * 1e3, (c1 - c) * 1e3
            row["other"] = row["window"] - row["propose"] - row["score"] - row["update"]
            row["tokens"] = len(step.token_ids)
            row["nodes"] = now.get("nodes", 1)
            row["curve"] = row["curve"] or curve.ms(1)
            steps.append(row)
        now.clear()
        t, c = time.perf_counter(), time.thread_time()


def main(prompts: str = str(DEFAULT_PROMPTS), limit: str = "4", tokens: str = "64",
         dtype: str = "auto",
         variants: str = "none,plain-loop,lookup,eagle3,eagle3:8,eagle3:4,auto") -> None:
    target = load("demo", dtype=dtype, progress=False)
    curve = verify_cost_curve(target)
    print(f"curve ({dtype}): " + ", ".join(f"{n}: {curve.ms(n):.1f}" for n in (1, 2, 4, 8, 16)))
    names = variants.split(",")
    steps: dict[str, list[dict]] = {v: [] for v in names}
    items = load_prompts(prompts, limit=int(limit))
    arms: dict[str, int] = {}  # auto's bandit steps and sure steps per arm, over the prompts
    for v in names:  # warm-up (first-call allocations, compiled shapes), not counted
        e = engine_for(v, target)
        run(e, instrument(e, curve), curve, items[0], 16, [])
    for p in items:
        for v in names:
            e = engine_for(v, target)
            run(e, instrument(e, curve), curve, p, int(tokens), steps[v])
            if hasattr(e.drafter, "report"):
                for arm, r in e.drafter.report().items():
                    arms[arm] = arms.get(arm, 0) + r["steps"] + r["sure_steps"]
    print(f"{'variant':>11} {'tok/step':>8} {'tok/s':>6} {'nodes':>5} "
          + " ".join(f"{p:>7}" for p in PARTS) + "   (mean ms per step; median window)")
    for v, rows in steps.items():
        toks = sum(r["tokens"] for r in rows)
        secs = sum(r["window"] for r in rows) / 1e3
        mean = {p: statistics.fmean(r[p] for r in rows) for p in PARTS}
        print(f"{v:>11} {toks / len(rows):>8.2f} {toks / secs:>6.1f} "
              f"{statistics.fmean(r['nodes'] for r in rows):>5.1f} "
              + " ".join(f"{mean[p]:>7.2f}" for p in PARTS)
              + f"   {statistics.median(r['window'] for r in rows):.2f}")
    if arms:
        print("auto's steps per arm (bandit + sure): " + ", ".join(f"{a} {n}" for a, n in arms.items()))


if __name__ == "__main__":
    main(*sys.argv[1:])
