"""EAGLE-3 on this machine: draft vocabulary size x tree budget -> draft ms, verify ms, tau, tok/s.

    python scripts/vocab_budget.py [--head models/SmolLM2-135M-Instruct/eagle3]
        [--vocabs 2048,4096,8192,16384] [--budgets 4,8,16,adaptive] [--limit 12]
        [--prompts data/SmolLM2-135M-Instruct/heldout-questions.jsonl] [--head-bits 8]
        [--no-lookup] [--max-tokens 128] [--json out.json]

The issue asks which draft vocabulary pays on a small target, where the head's LM head is a
large share of a draft step. Training one head per size costs a GPU run each, so the sizes are
made from one trained head, and the table says so. Token frequencies rank the ids: the labels
of the head's training split when its feature store (``recipe.json``'s ``work_dir``) is here,
else the tokens of the model's own answers in the shipped corpus (``--corpus``: the same kind of
text, the model's greedy answers to questions it wrote).

- A vocabulary of size V at most the trained one keeps the trained head's V most frequent ids
  and their trained LM-head rows: a pure pruning, no untrained row.
- A larger V adds the most frequent other ids with the target's own LM-head rows, which is how
  training initializes every row; its tau is a lower bound for a head trained at that size.

The drafter is the ``eagle3`` method's: the head in ``--head-bits`` (8 by default where the
native kernels run) and prompt lookup drafting the steps it is sure of (``--no-lookup``: the
head alone). Each budget is a fixed number of verified nodes or ``adaptive`` (sized per step
from this device's verify-cost curve). Plain decoding runs first on every prompt in the same
process; speedup is tokens/s over it. Default prompts: the held-out training-style questions
(``data/SmolLM2-135M-Instruct/heldout-questions.jsonl``), on which a choice may be made;
the held-out evaluation prompts (MT-bench, passed with ``--prompts``) only measure. Run it on an
otherwise idle machine.
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
from edgespec.drafters.lookup import PromptLookupDrafter
from edgespec.engine import Engine
from edgespec.heads.corpus import read_sources
from edgespec.heads.eagle3 import Eagle3Head, quantized_head
from edgespec.heads.formats import load_head
from edgespec.heads.medusa import target_lm_head_rows
from edgespec.kernels.backend import native_enabled
from edgespec.loading.hub import resolve_model
from edgespec.targets import load_target
from edgespec.targets.cost import verify_cost_curve
from edgespec.training import trainer
from edgespec.training.features import FeatureStore
from edgespec.training.vocab import label_counts

ROOT = Path(__file__).resolve().parents[1]
HELD_OUT = ROOT / "data" / "SmolLM2-135M-Instruct" / "heldout-questions.jsonl"
CORPUS = ROOT / "models" / "SmolLM2-135M-Instruct" / "corpus"


def label_ranking(target, recipe: dict, corpus: Path) -> tuple[np.ndarray, str]:
    """Target ids, most frequent first (ties: smaller id), and where the counts came from."""
    V = target.args.vocab_size
    store_dir = Path(recipe.get("work_dir", "")) / "features"
    if recipe.get("work_dir") and store_dir.is_dir():
        store = FeatureStore.open(store_dir)
        s = recipe["settings"]
        train_seqs, _ = trainer.split(len(store), s["held_out"], s["seed"])
        counts, source = label_counts(store, train_seqs, V), f"training labels ({store_dir})"
    else:
        sources, _ = read_sources(corpus)
        docs = [d for ds in sources.values() for d in ds]
        counts = np.bincount(np.concatenate(docs), minlength=V)[:V]
        source = f"the corpus's {sum(len(d) for d in docs):,} answer tokens ({corpus})"
    return np.lexsort((np.arange(V), -counts)), source


def resized(head: Eagle3Head, target, ranking: np.ndarray, size: int) -> Eagle3Head:
    """A copy of ``head`` with ``size`` ids: the trained head's most frequent ones first (their
    trained rows), then, past its own size, the most frequent others (the target's rows)."""
    mine = np.array(head.to_draft_ids(mx.array(ranking)))  # -1 where the trained head lacks it
    order = np.concatenate([ranking[mine >= 0], ranking[mine < 0]])
    ids = np.sort(order[:size])
    out = Eagle3Head(dataclasses.replace(head.config, draft_vocab_size=len(ids)))
    out.load_weights([(k, v) for k, v in tree_flatten(head.parameters())
                      if not k.startswith("lm_head")], strict=False)
    rows = target_lm_head_rows(target, ids)
    mine = np.array(head.to_draft_ids(mx.array(ids)))
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
    ap.add_argument("--vocabs", default="2048,4096,8192,16384")
    ap.add_argument("--budgets", default="4,8,16,adaptive")
    ap.add_argument("--prompts", default=str(HELD_OUT))
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--corpus", default=str(CORPUS), help="token counts when no feature store")
    ap.add_argument("--head-bits", type=int, default=None, help="8, 4 or 0 (float32); default: "
                    "8 where the native kernels run, else float32 (as the eagle3 method)")
    ap.add_argument("--no-lookup", action="store_true", help="the head alone, no prompt lookup")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)

    target = load_target(resolve_model(a.model), dtype="float32")
    if a.head is None:
        from edgespec.heads.find import find_head
        a.head = str(find_head(target, "eagle3"))
    _, head = load_head(a.head, target)
    recipe = json.loads((Path(a.head) / "recipe.json").read_text())
    ranking, counted = label_ranking(target, recipe, Path(a.corpus))
    prompts = load_prompts(a.prompts, a.limit)
    curve = verify_cost_curve(target)
    vocabs = [int(v) for v in a.vocabs.split(",")]
    budgets = [b if b == "adaptive" else int(b) for b in a.budgets.split(",")]
    bits = (8 if native_enabled() else 0) if a.head_bits is None else a.head_bits
    heads = {}
    for v in vocabs:
        h = resized(head, target, ranking, v)
        heads[v] = quantized_head(h, bits) if bits else h

    def drafter(v, b):
        return Eagle3Drafter(target, heads[v], curve if b == "adaptive" else None,
                             nodes=None if b == "adaptive" else b,
                             max_nodes=32 if b == "adaptive" else max(32, b),
                             lookup=None if a.no_lookup else PromptLookupDrafter())

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
    print(f"head {a.head} (trained draft vocabulary {head.config.draft_vocab_size}; "
          f"{bits or 32}-bit; {'no lookup' if a.no_lookup else 'with lookup'}; ids ranked by "
          f"{counted}) · {len(prompts)} prompts × ≤{a.max_tokens} tokens, "
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
