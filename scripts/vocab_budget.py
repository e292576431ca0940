"""EAGLE-3 on this machine: draft vocabulary size x tree budget -> draft ms, verify ms, tau, tok/s.

    python scripts/vocab_budget.py [--head models/SmolLM2-135M-Instruct/eagle3]
        [--vocabs 4096,8192,16384,32768] [--budgets 4,8,16,adaptive] [--limit 8]
        [--max-tokens 128] [--json out.json]

The issue asks which draft vocabulary pays on a small target, where the head's LM head is a
large share of a draft step. Training one head per size costs an hour each here, so the sizes
are made from one trained head, and the table says so:

- the draft vocabulary of size V is the V most frequent labels of the head's *training* split
  (``training/vocab.py``, from the feature store named in the head's ``recipe.json``);
- ids the trained head has keep their trained LM-head row; ids it lacks get the target's own
  LM-head row, which is how training initializes every row (so a larger V adds untrained rows,
  a smaller V drops trained ones).

So the draft and verify costs are those of a head of that size, and tau is a lower bound for
V larger than the trained head's. Each budget is a fixed number of verified nodes
(``--no-adaptive --num-draft N``) or ``adaptive`` (sized per step from this device's
verify-cost curve). Plain decoding runs first on every prompt in the same process; speedup is
tokens/s over it. Prompts: MT-bench first turns (measuring only; nothing is tuned on them).
Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import edgespec  # noqa: F401  (first: it loads the optimized BLAS before MLX starts)
import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from tqdm import tqdm

from edgespec.bench import _header, environment, load_prompts
from edgespec.drafters.eagle3 import Eagle3Drafter
from edgespec.engine import Engine
from edgespec.heads.eagle3 import Eagle3Head
from edgespec.heads.formats import load_head
from edgespec.heads.medusa import target_lm_head_rows
from edgespec.loading.hub import resolve_model
from edgespec.targets import load_target
from edgespec.targets.cost import verify_cost_curve
from edgespec.training import trainer
from edgespec.training.features import FeatureStore
from edgespec.training.vocab import draft_vocabulary

EVAL = Path(__file__).resolve().parents[2] / "shared" / "eval" / "mt_bench.jsonl"


def resized(head: Eagle3Head, target, store: FeatureStore, recipe: dict, size: int) -> Eagle3Head:
    """A copy of ``head`` with the ``size`` most frequent training labels as its vocabulary."""
    s = recipe["settings"]
    train_seqs, held_seqs = trainer.split(len(store), s["held_out"], s["seed"])
    ids, _ = draft_vocabulary(store, train_seqs, held_seqs, size, target.args.vocab_size)
    out = Eagle3Head(dataclasses.replace(head.config, draft_vocab_size=len(ids)))
    out.load_weights([(k, v) for k, v in tree_flatten(head.parameters())
                      if not k.startswith("lm_head")], strict=False)
    rows = target_lm_head_rows(target, ids)
    mine = np.array(head.to_draft_ids(mx.array(ids)))  # -1 where the trained head lacks the id
    have = np.nonzero(mine >= 0)[0]
    rows[mx.array(have)] = head.lm_head.weight[mx.array(mine[have])]
    out.lm_head.weight = rows
    out.set_draft_vocab(ids)
    mx.eval(out.parameters())
    return out


STATS = ("tokens", "decode_s", "draft_s", "verify_s", "forwards")


def run(engine: Engine, prompt, max_tokens: int) -> dict:
    """One prompt's ``STATS`` and token ids."""
    r = engine.generate([{"role": "user", "content": prompt.text}], max_tokens=max_tokens)
    s = r.stats
    return {"tokens": s.generated_tokens, "decode_s": s.decode_s, "draft_s": s.draft_s,
            "verify_s": s.verify_s, "forwards": s.target_forwards, "ids": r.token_ids}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--head", default=None, help="EAGLE-3 head dir (default: the one found for the model)")
    ap.add_argument("--vocabs", default="4096,8192,16384,32768")
    ap.add_argument("--budgets", default="4,8,16,adaptive")
    ap.add_argument("--prompts", default=str(EVAL))
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)

    target = load_target(resolve_model(a.model), dtype="float32")
    if a.head is None:
        from edgespec.heads.find import find_head
        a.head = str(find_head(target, "eagle3"))
    _, head = load_head(a.head, target)
    recipe = json.loads((Path(a.head) / "recipe.json").read_text())
    store = FeatureStore.open(Path(recipe["work_dir"]) / "features")
    prompts = load_prompts(a.prompts, a.limit)
    curve = verify_cost_curve(target)
    vocabs = [int(v) for v in a.vocabs.split(",")]
    budgets = [b if b == "adaptive" else int(b) for b in a.budgets.split(",")]
    heads = {v: resized(head, target, store, recipe, v) for v in vocabs}

    def drafter(v, b):
        return Eagle3Drafter(target, heads[v], curve if b == "adaptive" else None,
                             nodes=None if b == "adaptive" else b,
                             max_nodes=32 if b == "adaptive" else max(32, b))

    Engine(target).generate([{"role": "user", "content": prompts[0].text}], max_tokens=16)
    cells = [(v, b) for v in vocabs for b in budgets]
    engines = {c: Engine(target, drafter(*c)) for c in cells}
    for e in engines.values():  # warm-up
        e.generate([{"role": "user", "content": prompts[0].text}], max_tokens=16)
    t0 = time.perf_counter()
    per = {c: [] for c in ["none", *cells]}
    with tqdm(total=len(prompts) * (1 + len(cells)), desc="vocab x budget", file=sys.stderr) as bar:
        for p in prompts:  # per prompt, plain first and then every cell: drift hits all alike
            per["none"].append(run(Engine(target), p, a.max_tokens))
            bar.update()
            for c in cells:
                per[c].append(run(engines[c], p, a.max_tokens))
                bar.update()
    results = {}
    for c, rows in per.items():
        results[c] = {k: sum(r[k] for r in rows) for k in STATS}
        results[c]["exact"] = sum(r["ids"] == b["ids"] for r, b in zip(rows, per["none"]))
    base = results["none"]["tokens"] / results["none"]["decode_s"]
    env = environment(target, max_tokens=a.max_tokens, num_prompts=len(prompts),
                      prompts_file=a.prompts)
    print(_header(env))
    print(f"head {a.head} (trained draft vocabulary "
          f"{head.config.draft_vocab_size}) · {len(prompts)} prompts × ≤{a.max_tokens} tokens, "
          f"greedy · plain {base:.1f} tok/s · {time.perf_counter() - t0:.0f} s")
    print("| draft vocab | budget | draft ms/step | verify ms/step | τ | tok/s | speedup | exact |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    table = []
    for c in cells:
        r = results[c]
        row = {"vocab": c[0], "budget": c[1], "draft_ms": 1e3 * r["draft_s"] / r["forwards"],
               "verify_ms": 1e3 * r["verify_s"] / r["forwards"], "tau": r["tokens"] / r["forwards"],
               "tok_s": r["tokens"] / r["decode_s"], "exact": f"{r['exact']}/{len(prompts)}"}
        row["speedup"] = row["tok_s"] / base
        table.append(row)
        print(f"| {c[0]} | {c[1]} | {row['draft_ms']:.1f} | {row['verify_ms']:.1f} | "
              f"{row['tau']:.2f} | {row['tok_s']:.1f} | {row['speedup']:.2f}× | {row['exact']} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"env": env, "plain_tok_s": base, "rows": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
