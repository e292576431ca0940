"""The recurrent rollback's share of a speculative step on a hybrid model sized like the demo,
per method, for the two ways of keeping a tree's recurrent states:

- kept:   every node's state from the verify forward is kept; committing the accepted path
          picks its last node's state (what ``targets/recurrent.KeptStates`` does);
- replay: only the nodes' recurrence inputs are kept; committing replays the accepted path's
          tokens through the gated delta rule from the committed state (``Replayed`` below).

    python scripts/recurrent_rollback.py [--layers 28] [--accept 2] [--steps 30] [--json out.json]

The model: Qwen3.5's layout (``qwen3_5``: three gated DeltaNet layers to one gated attention
layer) at the demo's width (hidden 576, 9 heads of 64, 3 key/value heads, MLP 1536, a tied
49152-token vocabulary; DeltaNet 4 key heads and 8 value heads of 64, conv width 4), random
weights, float32, ~136M parameters with 28 layers. After a 200-token prefill each step is scored
from the same committed history (the step's forward, then the commit of a path of ``--accept``
drafts + the bonus), as the engine does for each method's tree shape:

- plain: one node; draft / layer-skip / quantized: a chain of 4 drafts (their own draft caches'
  rollback is a trim to a kept commit: a dictionary lookup); lookup: three branches of 3
  (10 nodes); eagle3: a 16-node tree of depth 4 (``_TREE16``); early-exit: the chain's 5 nodes
  fed one at a time through the lower half of the layers inside the target's cache, trimmed
  back, the upper layers verified (``LowerLayers``).

Reported per method and strategy: the median step (forward + readback + commit), the median
rollback (the commit and the evaluation of the committed states), and the share. Run it on an
otherwise idle machine; ``--json`` writes the table.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import edgespec  # noqa: F401  (first: it loads the optimized BLAS before MLX starts)
import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from edgespec.targets import recurrent
from edgespec.targets.families import FAMILIES
from edgespec.targets.lower_layers import LowerLayers
from edgespec.targets.target import Target
from edgespec.tree import DraftTree

DEMO_HYBRID = {"model_type": "qwen3_5", "hidden_size": 576, "intermediate_size": 1536,
               "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
               "vocab_size": 49152, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
               "full_attention_interval": 4, "linear_num_key_heads": 4,
               "linear_num_value_heads": 8, "linear_key_head_dim": 64,
               "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4,
               "max_position_embeddings": 8192}
_TREE16 = [-1, 0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 5, 5, 8, 11, 13]


class Replayed:
    """The replay candidate: the forward's conv buffer and recurrence inputs; ``after(u)``
    replays u's path from the committed state."""

    def __init__(self, buf, idx, k, inputs):
        self.buf, self.idx, self.k = buf, idx, k
        self.q, self.kk, self.v, self.g, self.beta, self.state0, self.tree = inputs

    def after(self, u: int) -> tuple:
        window = recurrent.window_after(self.buf, self.idx, self.k, u)
        path = self.tree.path_to(u) if self.tree is not None else range(u + 1)
        s = self.state0
        for j in path:
            _, s = recurrent.delta_step(self.q[j : j + 1], self.kk[j : j + 1], self.v[j : j + 1],
                                        self.g[j : j + 1], self.beta[j : j + 1], s)
        return window, s


def build(layers: int) -> Target:
    family = FAMILIES["qwen3_5"]
    model = family.model(family.args.from_dict({**DEMO_HYBRID, "num_hidden_layers": layers}))
    mx.eval(model.parameters())
    return Target(model, tokenizer=None, dtype="float32")


def shapes(accept: int) -> dict[str, tuple[DraftTree, list[int]]]:
    """Per method: the verified tree and the accepted path (``accept`` drafts + root)."""
    chain = DraftTree.chain(5, [6, 7, 8, 9])
    lookup = DraftTree([5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [-1, 0, 1, 2, 0, 4, 5, 0, 7, 8])
    tree16 = DraftTree(list(range(5, 21)), _TREE16)

    def deepest(tree: DraftTree) -> list[int]:
        u = max(range(len(tree)), key=lambda i: (min(tree.depths()[i], accept), -i))
        return tree.path_to(u)

    return {"plain": (DraftTree.chain(5, []), [0]), "draft": (chain, deepest(chain)),
            "lookup": (lookup, deepest(lookup)), "eagle3": (tree16, deepest(tree16)),
            "early-exit": (chain, deepest(chain))}


def step(target: Target, cache, tree: DraftTree, path: list[int], lower: int | None):
    """One verify step from the committed history; returns (step s, rollback s), then undoes
    the commit so the next step starts from the same place."""
    t0 = time.perf_counter()
    if lower:
        fed = LowerLayers(target, cache, lower)
        fed.begin(len(tree))
        for t in tree.tokens:
            mx.eval(fed.feed(t))
        out = fed.score(tree)
    else:
        out = target.score(tree, cache)
    mx.eval(out.logits)
    t1 = time.perf_counter()
    cache.commit(path)
    mx.eval(cache.state())
    t2 = time.perf_counter()
    cache.trim(len(path))
    return t2 - t0, t2 - t1


def measure(target: Target, accept: int, steps: int, early: int) -> list[dict]:
    """Both strategies on their own caches (the same 200-token history), their steps
    interleaved so that a machine's load falls on both alike."""
    kept = recurrent.keep_states
    strategies = {"kept": kept,
                  "replay": lambda buf, idx, k, states, inputs: Replayed(buf, idx, k, inputs)}
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, 49152, 200)]
    caches = {}
    for name, keep in strategies.items():
        recurrent.keep_states = keep
        caches[name] = target.make_cache()
        target.score(prompt, caches[name], head=False)
        caches[name].commit()
        mx.eval(caches[name].state())
    rows = []
    for method, (tree, path) in shapes(accept).items():
        lower = early if method == "early-exit" else None
        got: dict[str, list] = {name: [] for name in strategies}
        for i in range(steps + 3):  # 3 warm-up steps (compiles)
            for name, keep in strategies.items():
                recurrent.keep_states = keep
                took = step(target, caches[name], tree, path, lower)
                if i >= 3:
                    got[name].append(took)
        for name in strategies:
            t = np.array(got[name])
            s, r = np.median(t[:, 0]), np.median(t[:, 1])
            rows.append({"method": method, "strategy": name, "nodes": len(tree),
                         "accepted_path": len(path), "step_ms": 1e3 * s, "rollback_ms": 1e3 * r,
                         "share": r / s})
    recurrent.keep_states = kept
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--accept", type=int, default=2, help="drafts accepted per step")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    target = build(args.layers)
    n = sum(v.size for _, v in tree_flatten(target.model.parameters())) / 1e6
    print(f"hybrid target: {args.layers} layers ({len(target.model.state_layers())} gated "
          f"DeltaNet), {n:.1f}M parameters, float32; {platform.processor() or platform.machine()}")
    rows = measure(target, args.accept, args.steps, args.layers // 2)
    print(f"{'method':<11}{'strategy':<9}{'nodes':>6}{'path':>6}{'step ms':>10}{'rollback ms':>13}"
          f"{'share':>8}")
    for r in rows:
        print(f"{r['method']:<11}{r['strategy']:<9}{r['nodes']:>6}{r['accepted_path']:>6}"
              f"{r['step_ms']:>10.2f}{r['rollback_ms']:>13.3f}{100 * r['share']:>7.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"params_m": n, "layers": args.layers, "accept": args.accept, "rows": rows},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
