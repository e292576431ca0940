"""The recurrent states a hybrid target's cache holds for rollback, per method, on a hybrid
model sized like the demo (``recurrent_rollback.py``'s ``build``: Qwen3.5's layout, random
weights, float32).

    python scripts/hybrid_state_memory.py [--layers 28] [--prompt 200] [--tokens 24] [--json out.json]

Per method (plain greedy, pipelined; prompt lookup; early exit through the lower half of the
layers): the engine's cache is watched at every commit (``HybridCache.held``: one state per
kept commit boundary per recurrent slot, plus the states the forward being committed keeps per
node), and reported during the prefill (its forward's scratch), after it, the most held just before a commit (the verify's
scratch included) and just after one, and at the end. Then a follow-up request that repeats
the prompt with another answer and a new turn: how many prompt tokens its prefill reused
(the prompt's end is pinned; without a kept state there it starts afresh).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import edgespec  # noqa: F401  (first: it loads the optimized BLAS before MLX starts)
import mlx.core as mx
import numpy as np

from edgespec import Engine, SamplingConfig
from edgespec.drafters.early_exit import EarlyExitDrafter
from edgespec.drafters.lookup import PromptLookupDrafter
from edgespec.kernels.backend import prefill_chunk
from edgespec.loading.tokenizer import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recurrent_rollback import build  # noqa: E402


def word_tokenizer(vocab: int) -> Tokenizer:
    """A tokenizer whose ids are words ``t0``.. (the engine decodes what it emits)."""
    import tokenizers

    words = {f"t{i} ": i for i in range(vocab)}
    return Tokenizer(tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="t0 ")))


def watch(target, seen: dict):
    """Make the target's caches record ``held()`` around each commit into ``seen``."""
    make = target.make_cache

    def make_cache(layers=None):
        cache = make(layers)
        commit = cache.commit

        def watched(path=None):
            before = cache.held()
            commit(path)
            seen.setdefault("commits", []).append((before, cache.held(), path is None))
        cache.commit = watched
        return cache

    target.make_cache = make_cache


def run(target, method: str, prompt: list[int], tokens: int, layers: int) -> dict:
    greedy = SamplingConfig()
    drafter = {"plain": None, "lookup": PromptLookupDrafter(num_draft=4, max_draft=4),
               "early-exit": EarlyExitDrafter(target, greedy, exit_layer=layers // 2,
                                              num_draft=4, adaptive=False)}[method]
    seen: dict = {}
    engine = Engine(target, drafter)
    watch(target, seen)
    steps = sum(1 for _ in engine.stream(prompt, max_tokens=tokens))
    chunk = prefill_chunk(target.model.native_blocks())
    prefilled = -(-(len(prompt) - 1) // chunk)  # the prefill's commits come first
    commits = seen["commits"]
    after_prefill, decode = commits[prefilled - 1][1], commits[prefilled:]
    final = engine._cache.held()
    answer = [int(t) for t in np.random.default_rng(1).integers(3, 49152, 8)]
    turn = [int(t) for t in np.random.default_rng(2).integers(3, 49152, 6)]
    follow = engine.generate(prompt + answer + turn, max_tokens=2)
    del target.make_cache  # the class's again
    slots = len(engine._cache.recurrent)
    mib = 2**20
    return {"method": method, "steps": steps, "slots": slots,
            "prefill_before_commit": max(b[0] for b, _, _ in commits[:prefilled]),
            "prefill_before_commit_mib": max(b[1] for b, _, _ in commits[:prefilled]) / mib,
            "after_prefill": after_prefill[0], "after_prefill_mib": after_prefill[1] / mib,
            "max_before_commit": max(b[0] for b, _, _ in decode),
            "max_before_commit_mib": max(b[1] for b, _, _ in decode) / mib,
            "max_after_commit": max(a[0] for _, a, _ in decode),
            "max_after_commit_mib": max(a[1] for _, a, _ in decode) / mib,
            "final": final[0], "final_mib": final[1] / mib,
            "follow_up_cached": follow.stats.cached_tokens, "follow_up_prompt": len(prompt) + 14}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--prompt", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--methods", default="plain,lookup,early-exit")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    target = build(args.layers)
    target.tokenizer = word_tokenizer(target.args.vocab_size)
    half = [int(t) for t in np.random.default_rng(0).integers(3, 49152, args.prompt // 2)]
    prompt = half + half  # lookup then finds continuations to propose
    rows = [run(target, m, prompt, args.tokens, args.layers) for m in args.methods.split(",")]
    print(f"{'method':<11}{'steps':>6}{'prefill forward':>18}{'after prefill':>18}{'max before commit':>22}"
          f"{'max after commit':>21}{'final':>17}{'follow-up reused':>18}")
    for r in rows:
        cell = lambda k: f"{r[k]:>4} ({r[k + '_mib']:6.1f} MiB)"  # noqa: E731
        print(f"{r['method']:<11}{r['steps']:>6}{cell('prefill_before_commit'):>18}"
              f"{cell('after_prefill'):>18}"
              f"{cell('max_before_commit'):>22}{cell('max_after_commit'):>21}{cell('final'):>17}"
              f"{r['follow_up_cached']:>8}/{r['follow_up_prompt']}")
    print(f"(states: recurrent states held, summed over the {rows[0]['slots']} recurrent slots)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"layers": args.layers, "prompt": args.prompt, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
