"""The EAGLE-3 head's learning curve on this machine: held-out top-1 agreement with the model
against training rows seen and wall time, beside an n-gram table counted on the same training
split.

    python scripts/head_curve.py WORK_DIR [--minutes 40] [--depths 1] [--draft-vocab 8192]
                                 [--lr 8e-4] [--json curve.json]

WORK_DIR is an ``edgespec train`` work dir whose features are done (its ``features/`` store:
questions the model wrote itself and its greedy answers; no evaluation prompt is in it, the
training recipe drops them). The split is the trainer's (by sequence, seeded); the head is a
fresh one built as ``edgespec train`` builds it (LM head rows from the target's, seeded).

What it asks: does the head keep learning with more of this CPU's time, and how far is it from
a table of the same answers? The learning rate is held constant after a linear warm-up (a cosine
schedule would need the step count in advance, and the curve should read "trained this long").
Evaluations come at roughly doubling step counts, on the held-out split and on a fixed sample
of training windows of the same size (the gap between the two says whether more data or more
steps is what is missing). The n-gram baselines predict row p's label (the model's token after
next) from the one or two tokens before it, counted over the training rows, backing off to the
shorter context; they see the same rows the head is scored on. Measuring only: nothing here is
shipped or tuned on evaluation prompts.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from pathlib import Path

import edgespec  # noqa: F401  (first: it loads the optimized BLAS before MLX starts)
import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from tqdm import tqdm

from edgespec.heads.config import HeadConfig
from edgespec.heads.eagle3 import Eagle3Head
from edgespec.heads.medusa import target_lm_head_rows
from edgespec.loading.hub import resolve_model
from edgespec.targets import load_target
from edgespec.training import trainer
from edgespec.training.features import FeatureStore
from edgespec.training.objectives import Eagle3Objective
from edgespec.training.vocab import draft_vocabulary


def rows_of(store: FeatureStore, seqs: list[int]):
    """(x_p, x_{p+1}, label of row p) for every trained row p of the sequences."""
    for s in seqs:
        r = store.rows(s)
        ids, labels = np.asarray(store.ids[r]), np.asarray(store.labels[r])
        mask = np.asarray(store.mask[r])
        for p in range(len(ids) - 1):
            if mask[p + 1]:
                yield int(ids[p]), int(ids[p + 1]), int(labels[p + 1])


def ngram_agreement(store: FeatureStore, train: list[int], held: list[int]) -> dict:
    """Held-out top-1 of the most frequent training label after (x_p, x_{p+1}) (trigram), after
    x_{p+1} alone (bigram), each backing off to the shorter context, then the commonest label."""
    tri, bi, uni = defaultdict(Counter), defaultdict(Counter), Counter()
    for a, b, y in rows_of(store, train):
        tri[(a, b)][y] += 1
        bi[b][y] += 1
        uni[y] += 1
    top = uni.most_common(1)[0][0]
    best = lambda c: c.most_common(1)[0][0]  # noqa: E731
    hits_tri = hits_bi = n = 0
    for a, b, y in rows_of(store, held):
        guess_bi = best(bi[b]) if b in bi else top
        guess_tri = best(tri[(a, b)]) if (a, b) in tri else guess_bi
        hits_tri += guess_tri == y
        hits_bi += guess_bi == y
        n += 1
    return {"rows": n, "trigram": round(hits_tri / n, 4), "bigram": round(hits_bi / n, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work_dir")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--minutes", type=float, default=40.0)
    ap.add_argument("--depths", type=int, default=1)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--lr", type=float, default=8e-4)
    ap.add_argument("--warmup", type=int, default=30, help="warm-up steps")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--held-out", type=float, default=0.1)
    ap.add_argument("--train-fraction", type=float, default=1.0,
                    help="train (head and tables) on this seeded share of the training split")
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the curve here")
    a = ap.parse_args()

    if not 0 < a.train_fraction <= 1:
        raise SystemExit(f"--train-fraction must be in (0, 1], got {a.train_fraction}")
    if a.warmup < 1 or a.minutes <= 0:
        raise SystemExit(f"--warmup must be >= 1 and --minutes > 0, got {a.warmup} and {a.minutes}")
    store = FeatureStore.open(Path(a.work_dir) / "features")
    target = load_target(resolve_model(a.model), dtype="float32")
    train_seqs, held_seqs = trainer.split(len(store), a.held_out, a.seed)
    keep = np.random.default_rng([a.seed, 5]).permutation(len(train_seqs))
    n_train = max(1, round(a.train_fraction * len(train_seqs)))
    train_seqs = sorted(train_seqs[i] for i in keep[:n_train])
    base = ngram_agreement(store, train_seqs, held_seqs)
    print(f"store: {len(store)} sequences, {store.tokens} tokens; training on {len(train_seqs)}, "
          f"held out {len(held_seqs)}; n-gram tables on the held-out rows: {base}", flush=True)
    head, coverage = fresh_head(target, store, train_seqs, held_seqs, a.draft_vocab, a.seed)
    result = {"settings": vars(a), "store": {"sequences": len(store), "tokens": store.tokens,
                                             "train_sequences": len(train_seqs)},
              "draft_vocab_coverage": coverage, "ngram": base, "curve": []}
    objective = Eagle3Objective(head, target, store, a.depths)
    train_w = trainer.windows(store, train_seqs, objective, a.window)
    held_w = trainer.windows(store, held_seqs, objective, a.window)
    sample = np.random.default_rng([a.seed, 3]).choice(
        len(train_w), min(len(held_w), len(train_w)), replace=False)
    print(f"draft vocabulary {head.config.draft_vocab_size} covers {coverage:.1%} of held-out "
          f"labels; {len(train_w)} training windows "
          f"({trainer.steps_per_epoch(len(train_w), a.batch_size)} steps an epoch)", flush=True)

    def save():  # after every evaluation: a killed run keeps its curve so far
        if a.json:
            Path(a.json).write_text(json.dumps(result, indent=1))

    rows_per_s = train_curve(a, objective, train_w, {"held": held_w,
                             "train_sample": [train_w[i] for i in sample]}, result["curve"], save)
    result["rows_per_s"] = rows_per_s
    save()
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}))


def fresh_head(target, store: FeatureStore, train_seqs, held_seqs, vocab: int, seed: int):
    """A new head as ``edgespec train`` builds one (seeded; its LM head the target's rows of
    the draft vocabulary), and what that vocabulary covers of the held-out labels."""
    mx.random.seed(seed)
    ids, coverage = draft_vocabulary(store, train_seqs, held_seqs, vocab, target.args.vocab_size)
    config = HeadConfig.for_target(target, "eagle3", draft_vocab_size=len(ids),
                                   aux_layers=tuple(store.meta["aux_layers"]))
    head = Eagle3Head(config)
    head.set_draft_vocab(ids)
    head.lm_head.weight = target_lm_head_rows(target, ids)
    return head, coverage


def train_curve(a, objective, train_w: list, evals: dict, curve: list, save) -> float:
    """Train for ``a.minutes``; at steps 16, 24, 36, ... (x1.5) and at the end append a point
    (held-out and training-sample metrics) to ``curve`` and call ``save``. Returns rows/s."""
    head = objective.module
    lr = optim.join_schedules([optim.linear_schedule(a.lr / a.warmup, a.lr, a.warmup),
                               lambda _: mx.array(a.lr)], [a.warmup])
    opt = optim.AdamW(learning_rate=lr, weight_decay=0.0)
    opt.init(head.trainable_parameters())
    step_fn, live = trainer.compiled_step(objective, opt, a.clip)

    evals = {k: sorted(w, key=lambda w: (w[2] - w[1], w)) for k, w in evals.items()}
    per_epoch = trainer.steps_per_epoch(len(train_w), a.batch_size)
    step, rows, trained_s, next_eval = 0, 0, 0.0, 16
    t_end = time.perf_counter() + 60 * a.minutes
    bar = tqdm(total=round(60 * a.minutes), desc="train (s of the budget)", unit="s")
    while True:
        t0 = time.perf_counter()
        batch = objective.batch(trainer.batch_at(step, train_w, a.batch_size, a.seed))
        loss, _ = step_fn(batch)
        mx.eval(live, loss)
        trained_s += time.perf_counter() - t0
        rows += int(batch["mask"].sum())
        step += 1
        done = time.perf_counter() >= t_end
        if step == next_eval or done:
            point = {"step": step, "epochs": round(step / per_epoch, 2), "rows": rows,
                     "train_s": round(trained_s, 1),
                     **{k: trainer.evaluate(objective, w, a.batch_size) for k, w in evals.items()}}
            curve.append(point)
            save()
            scores = " | ".join(f"{k} d0 {point[k]['d0']:.4f} loss {point[k]['loss']:.3f}"
                                for k in evals)
            tqdm.write(f"step {step:5d} ({point['epochs']:5.2f} epochs, {rows:8d} rows, "
                       f"{trained_s:6.0f} s): {scores}")
            next_eval = max(next_eval + 1, round(next_eval * 1.5))
        bar.n = min(round(60 * a.minutes - max(t_end - time.perf_counter(), 0)), bar.total)
        bar.refresh()
        if done:
            return round(rows / trained_s, 1)

if __name__ == "__main__":
    main()
