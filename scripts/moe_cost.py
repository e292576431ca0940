"""The verify-cost curve of a mixture-of-experts model sized like the demo, next to a dense one,
and the node budget tree sizing chooses on each.

    python scripts/moe_cost.py [--experts 8] [--top-k 2] [--bits 0|4|8] [--sizes 1,2,...,16]
        [--repeats 5] [--json out.json]

Both are random-weight models of the demo's shape (SmolLM2-135M: hidden 576, 30 layers, 9
heads, 3 key/value heads, a tied 49152-token vocabulary):

- dense: the llama family, MLP 1536 wide (134.5M parameters), fused as ``load_target`` fuses it;
- dense-module: the same model on the module path (unfused, as the MoE blocks run: no fused
  form yet), which separates the experts' cost from the fused kernels';
- moe: ``qwen3_moe`` with the same attention and, in every layer, ``--experts`` experts of width
  1536 / experts (the same total, ~135M) of which ``--top-k`` run per token (active expert
  weights: top-k / experts of them, a quarter by default).

Each curve is ``targets.cost.measure_cost_curve``'s measurement (what ``edgespec`` caches per
model and tree sizing reads) over ``--sizes``, one round at a time with the models taking turns
(``--repeats`` rounds, per-size medians, then ``monotone``); the budget is ``best_budget`` on that curve for two assumed
acceptance profiles (a chain whose d-th node is accepted with probability p^d, p = 0.8 and
0.6, plus a side branch per depth at a tenth of that): what an adaptive drafter would verify.
Random weights route tokens near uniformly; a trained router's choices cluster, so a real
checkpoint's curve is at most this steep. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import edgespec  # noqa: F401  (first: it loads the optimized BLAS before MLX starts)
import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from edgespec.targets.cost import CostCurve, best_budget, measure_cost_curve, monotone
from edgespec.targets.experts import expert_shares
from edgespec.targets.families import FAMILIES
from edgespec.targets.target import Target

DEMO = {"hidden_size": 576, "num_hidden_layers": 30, "intermediate_size": 1536,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True,
        "max_position_embeddings": 8192}


def build(config: dict, bits: int, fuse: bool = True) -> Target:
    family = FAMILIES[config["model_type"]]
    model = family.model(family.args.from_dict(config))
    if bits:
        nn.quantize(model, group_size=64, bits=bits)
    mx.eval(model.parameters())
    if fuse:
        model.fuse()
    return Target(model, tokenizer=None, dtype="float32", quantized=bool(bits))


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def profile(p: float, depth: int = 16) -> np.ndarray:
    chain = p ** np.arange(1, depth + 1)
    return np.sort(np.concatenate([chain, 0.1 * chain]))[::-1]


def params(target: Target, bits: int) -> tuple[float, float]:
    """(total, active per token) parameters in millions (quantized: as weights, not words)."""
    shares = expert_shares(target.model)
    total = active = 0.0
    for k, v in tree_flatten(target.model.parameters()):
        if k.endswith((".scales", ".biases")):
            continue
        n = v.size * (32 // bits if v.dtype == mx.uint32 else 1)
        share = next((s for prefix, s in shares.items() if k.startswith(prefix)), 1.0)
        total, active = total + n, active + n * share
    return total / 1e6, active / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--bits", type=int, default=0, choices=(0, 4, 8))
    ap.add_argument("--sizes", default="1,2,3,4,6,8,12,16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if DEMO["intermediate_size"] % a.experts or not 1 <= a.top_k <= a.experts:
        ap.error(f"--experts must divide {DEMO['intermediate_size']} and --top-k be in "
                 f"[1, experts]; got {a.experts}, {a.top_k}")
    sizes = tuple(int(s) for s in a.sizes.split(","))
    moe = {**DEMO, "model_type": "qwen3_moe", "head_dim": 64, "num_experts": a.experts,
           "num_experts_per_tok": a.top_k, "moe_intermediate_size": 1536 // a.experts,
           "norm_topk_prob": True, "rms_norm_eps": 1e-6}
    dense = {**DEMO, "model_type": "llama"}
    configs = {"dense": (dense, True), "dense-module": (dense, False), "moe": (moe, True)}
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_name(),
           "mlx": mx.__version__, "bits": a.bits, "sizes": sizes, "models": {}}
    print(f"{out['date']}, {out['cpu']}, mlx {out['mlx']}, "
          f"{'float32' if not a.bits else f'{a.bits}-bit'}")
    targets = {}
    for name, (config, fuse) in configs.items():
        mx.random.seed(0)
        targets[name] = build(config, a.bits, fuse)
    runs = {name: [] for name in targets}  # per model, one measured round per entry
    for _ in range(a.repeats):  # the models take turns: drift lands on all of them alike
        for name, target in targets.items():
            runs[name].append(measure_cost_curve(target, sizes=sizes, repeats=1).times)
    for name, target in targets.items():
        total, active = params(target, a.bits)
        curve = CostCurve(sizes, monotone(np.median(np.array(runs[name]), axis=0)))
        budgets = {str(p): best_budget(profile(p), curve).nodes for p in (0.8, 0.6)}
        out["models"][name] = {"params_m": round(total, 1), "active_params_m": round(active, 1),
                               "ms": dict(zip(sizes, (round(t, 2) for t in curve.times))),
                               "budget_nodes": budgets}
        ms = "  ".join(f"{n}:{t:.1f}" for n, t in zip(sizes, curve.times))
        print(f"{name:12s} {total:.1f}M params, {active:.1f}M active per token")
        print(f"       verify ms by tokens  {ms}")
        print(f"       {sizes[-1]}/1 = {curve.times[-1] / curve.times[0]:.2f}x; budget (nodes "
              f"verified beyond the root): p=0.8 -> {budgets['0.8']}, p=0.6 -> {budgets['0.6']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
