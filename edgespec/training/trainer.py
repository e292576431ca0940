"""Training a head in MLX: AdamW, linear warm-up + cosine decay, gradient clipping, a held-out
split, atomic checkpoints, resume, a time budget; the same result whether or not it was resumed.

Contract: ``train(objective, store, plan, folder, deadline=...)`` runs steps ``start..plan.steps-1``
where ``start`` is the step of the newest checkpoint in ``folder`` (0 without one) and returns
the held-out metrics and timings. What a step sees depends only on ``(plan.seed, step)``: the
batches of an epoch are a seeded function of the epoch (``epoch_batches``: windows of similar
length together, batches in a shuffled order) and ``mx.random`` is reseeded
from (seed, step), so a run stopped by its budget (or killed) and resumed from its checkpoint
ends with the same weights as an uninterrupted one. A checkpoint (``step-N/``: weights,
optimizer state, ``state.json`` with step, seed and the rng key) is written to a temporary
folder and renamed, then ``latest`` names it; only the newest two are kept.

A step (loss, gradients, clipping, the AdamW update) is one ``mx.compile``d function of the
batch; batches are padded to a multiple of ``objectives.PAD_TO`` rows, so it is traced for a few
shapes only. It is compiled because that was measured faster than uncompiled on the demo
model's EAGLE-3 batches, tracing included (see docs/measurements.md, "what a trained head
costs").

The split is by sequence (``split``), seeded; the held-out windows are evaluated every
``plan.eval_every`` steps and at the end: loss and, per depth (EAGLE-3) or head (Medusa), top-1
agreement with the target, shown live in the bar's postfix.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from tqdm import tqdm

from .clock import Deadline, passed
from .features import FeatureStore


@dataclass(frozen=True)
class Plan:
    steps: int
    batch_size: int
    window: int
    lr: float
    warmup: int
    weight_decay: float
    clip: float
    seed: int
    eval_every: int
    checkpoint_every: int


def split(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(training, held-out) sequence indices: a seeded shuffle, at least one of each when n > 1."""
    order = np.random.default_rng([seed, 7]).permutation(n)
    held = min(max(1, round(fraction * n)), n - 1) if n > 1 else 0
    return sorted(order[held:].tolist()), sorted(order[:held].tolist())


def windows(store: FeatureStore, seqs: list[int], objective, size: int) -> list[tuple[int, int, int]]:
    """Each sequence's rows (``objective.rows``) in pieces of at most ``size``; pieces with no
    trained row are left out."""
    out = []
    for s in seqs:
        r = store.rows(s)
        lo, hi = objective.rows(np.asarray(store.mask[r]))
        for a in range(lo, hi, size):
            b = min(a + size, hi)
            if store.mask[r.start + a + 1 : r.start + b + 1].any():
                out.append((s, a, b))
    return out


def steps_per_epoch(n_windows: int, batch_size: int) -> int:
    return max(1, n_windows // batch_size)


POOL = 16
"""Batches are formed from pools of POOL x batch_size windows of similar length (less padding)."""


@functools.lru_cache(maxsize=2)
def epoch_batches(train: tuple, batch_size: int, seed: int, epoch: int) -> tuple:
    """The batches (tuples of window indices) of one epoch, in order: a seeded permutation, cut
    into pools whose windows are sorted by length and grouped, then the batches shuffled."""
    rng = np.random.default_rng([seed, 11, epoch])
    per = steps_per_epoch(len(train), batch_size)
    order = rng.permutation(len(train))
    if len(train) < batch_size:
        return (tuple(order.tolist()),)
    order = order[: per * batch_size]
    length = [b - a for _, a, b in train]
    batches = []
    for i in range(0, len(order), POOL * batch_size):
        pool = sorted(order[i : i + POOL * batch_size].tolist(), key=lambda k: (length[k], k))
        batches += [tuple(pool[j : j + batch_size]) for j in range(0, len(pool), batch_size)]
    return tuple(batches[i] for i in rng.permutation(len(batches)))


def batch_at(step: int, train: list, batch_size: int, seed: int) -> list:
    """The windows of ``step``: batch ``step % steps_per_epoch`` of epoch ``step // steps_per_epoch``."""
    epoch, k = divmod(step, steps_per_epoch(len(train), batch_size))
    return [train[i] for i in epoch_batches(tuple(train), batch_size, seed, epoch)[k]]


def schedule(plan: Plan):
    """Linear warm-up from lr/warmup to lr over ``warmup`` steps, then cosine decay to lr/20."""
    warm = max(1, plan.warmup)
    rest = max(1, plan.steps - warm)
    return optim.join_schedules([optim.linear_schedule(plan.lr / warm, plan.lr, warm),
                                 optim.cosine_decay(plan.lr, rest, plan.lr / 20)], [warm])


def evaluate(objective, held: list, batch_size: int) -> dict:
    """Held-out loss and per-name top-1, averaged over windows weighted by their trained rows."""
    total, weight, sums = 0.0, 0.0, np.zeros(len(objective.names))
    for i in range(0, len(held), batch_size):
        batch = objective.batch(held[i : i + batch_size])
        loss, metrics = objective.loss(objective.module, batch)
        w = float(batch["mask"].astype(mx.float32).sum())
        total += float(loss) * w
        sums += np.array([float(m) for m in metrics]) * w
        weight += w
    weight = max(weight, 1.0)
    return {"loss": round(total / weight, 4),
            **{n: round(float(v / weight), 4) for n, v in zip(objective.names, sums)}}


# --- checkpoints ------------------------------------------------------------------------------

def save_checkpoint(folder: Path, step: int, module: nn.Module, opt: optim.Optimizer, extra: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    final, tmp = folder / f"step-{step}", folder / f"step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    mx.save_safetensors(str(tmp / "weights.safetensors"), dict(tree_flatten(module.parameters())))
    mx.save_safetensors(str(tmp / "optimizer.safetensors"), dict(tree_flatten(opt.state)))
    key = np.array(mx.random.state[0]).tolist()
    (tmp / "state.json").write_text(json.dumps({"step": step, "rng_key": key, **extra}))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    pointer = folder / "latest.tmp"
    pointer.write_text(final.name)
    pointer.replace(folder / "latest")
    kept = sorted(folder.glob("step-*[0-9]"), key=lambda p: int(p.name[5:]))
    for old in kept[:-2]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(folder: Path, module: nn.Module, opt: optim.Optimizer) -> dict | None:
    """Restore the newest checkpoint into ``module`` and ``opt``; its state.json, or None."""
    pointer = folder / "latest"
    if not pointer.exists():
        return None
    path = folder / pointer.read_text().strip()
    module.load_weights(list(mx.load(str(path / "weights.safetensors")).items()), strict=True)
    opt.state = tree_unflatten(list(mx.load(str(path / "optimizer.safetensors")).items()))
    mx.eval(module.parameters(), opt.state)
    return json.loads((path / "state.json").read_text())


def compiled_step(objective, opt: optim.Optimizer, clip: float):
    """One training step of ``objective.module`` as one compiled function of the batch: loss,
    gradients, clipping to ``clip``, the optimizer's update. Returns it and the trees it updates
    (``live``: evaluate them after each step). Build it after any checkpoint is loaded."""
    module = objective.module
    grad_fn = nn.value_and_grad(module, lambda batch: objective.loss(module, batch))
    live = [module.state, opt.state]

    @functools.partial(mx.compile, inputs=live, outputs=live)
    def step_fn(batch):
        (loss, metrics), grads = grad_fn(batch)
        grads, _ = optim.clip_grad_norm(grads, clip)
        opt.update(module, grads)
        return loss, metrics

    return step_fn, live


# --- the loop ---------------------------------------------------------------------------------

def train(objective, store: FeatureStore, plan: Plan, folder: Path, *, train_seqs: list[int],
          held_seqs: list[int], deadline: Deadline | None = None, resume: bool = True) -> dict:
    """Train ``objective.module`` (see the module docstring); returns metrics and timings."""
    folder = Path(folder)
    module = objective.module
    train_w = windows(store, train_seqs, objective, plan.window)
    held_w = sorted(windows(store, held_seqs, objective, plan.window), key=lambda w: (w[2] - w[1], w))
    opt = optim.AdamW(learning_rate=schedule(plan), weight_decay=plan.weight_decay)
    opt.init(module.trainable_parameters())
    state = load_checkpoint(folder, module, opt) if resume else None
    if not resume:
        shutil.rmtree(folder, ignore_errors=True)
    start = state["step"] if state else 0
    history = state.get("history", []) if state else []

    step_fn, live = compiled_step(objective, opt, plan.clip)  # after the checkpoint is loaded
    bar = tqdm(total=plan.steps, initial=start, desc="train", unit="step")
    t0, step, stopped, rows = time.perf_counter(), start, False, 0
    last = history[-1] if history else {}

    def checkpoint():
        save_checkpoint(folder, step, module, opt, {"seed": plan.seed, "history": history})

    while step < plan.steps:
        if passed(deadline):
            stopped = True
            break
        mx.random.seed(plan.seed * 1_000_003 + step)
        batch = objective.batch(batch_at(step, train_w, plan.batch_size, plan.seed))
        loss, metrics = step_fn(batch)
        mx.eval(live, loss, metrics)
        rows += int(batch["mask"].sum())
        step += 1
        if step % plan.eval_every == 0 or step == plan.steps:
            last = {"step": step, **evaluate(objective, held_w, plan.batch_size)}
            history.append(last)
        if step % plan.checkpoint_every == 0 and step < plan.steps:
            checkpoint()
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss):.3f}", **{f"held_{k}": v for k, v in last.items()
                                                       if k not in ("step",)})
    bar.close()
    if step > start or state is None:
        checkpoint()
    seconds = time.perf_counter() - t0
    return {"steps": plan.steps, "done": step, "stopped_by_budget": stopped,
            "resumed_from": start, "train_windows": len(train_w), "held_windows": len(held_w),
            "seconds": round(seconds, 1),
            "rows_per_s": round(rows / seconds, 1) if rows and seconds else None,
            "held_out": last, "history": history}


def plan_steps(n_windows: int, batch_size: int, epochs: float, steps: int | None) -> int:
    return steps if steps is not None else max(1, math.ceil(epochs * steps_per_epoch(n_windows, batch_size)))
