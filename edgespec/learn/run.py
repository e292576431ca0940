"""``edgespec learn run``: fine-tune the EAGLE-3 head in use on what was recorded, guard, roll out.

Contract: ``run(target, model_dir, settings, pause=...)`` does, within ``settings.budget_s``:

1. **split** the records: the newest ``held_fraction`` (at least ``held_min``, at most
   ``held_max``) are the guard's held-out slice and are not trained on; the rest train. A run's
   split, starting head and data are frozen in ``train/active.json`` until the run ends, so a
   paused or killed run resumes on the same data.
2. **replay** general data (``replay.py``) made once per target, mixed in so the head does not
   forget what it knew;
3. **train** the head in use (a learned one, else the shipped one) from its weights, on the
   records then the replay (``dataset.py``), with the recipe's trainer: AdamW, warm-up and cosine
   decay, checkpoints every ``checkpoint_every`` steps, resumed after a kill or a pause. The step
   count is sized to the budget left (one timed probe of the compiled step), capped at
   ``epochs`` passes;
4. **guard** (``guard.py``) the new head against the one in use on the held-out slice;
5. **promote** it (``versions.py``) when it wins, else keep it aside as rejected;
6. **corpus**: every record's answer joins the n-gram corpus (the shipped corpus's sources plus
   one ``user`` source) that ``corpus`` and ``auto`` draft from, as a new corpus version.

``pause`` (a ``threading.Event``) stops training at the next step with a checkpoint; the run
returns ``status: paused`` and the next run continues. Returns the report (also written to
``train/last_run.json``).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import ConfigError
from ..heads.config import fingerprint
from ..heads.corpus import read_sources, save_corpus
from ..heads.find import find_head
from ..heads.formats import load_head, save_head
from ..heads.learned import learned_head, target_dir
from ..training import trainer
from ..training.clock import Deadline
from ..training.features import write_json
from ..training.objectives import Eagle3Objective
from ..training.vocab import vocab_coverage
from . import versions
from .dataset import build, digest
from .guard import MIN_GAIN, compare
from .replay import replay_store
from .session import usable
from .store import Record, RecordStore, private_dir


@dataclass(frozen=True)
class LearnSettings:
    budget_s: float = 1200.0
    min_answer_tokens: int = 2000  # recorded answer tokens (training split) before a run trains
    held_fraction: float = 0.12
    held_min: int = 4
    held_max: int = 40
    replay_tokens: int = 24_000
    # a gentle fine-tune: four passes at 2e-4 fitted the trained conversations and lost τ on the
    # held-out ones and on general prompts; one pass at 5e-5 held both (docs/measurements.md,
    # "Learning from use")
    epochs: float = 1.0
    lr: float = 5e-5
    batch_size: int = 8
    window: int = 512
    depths: int = 3
    checkpoint_every: int = 50
    guard_tokens: int = 128
    min_gain: float = MIN_GAIN
    seed: int = 0

    def __post_init__(self):
        for name in ("budget_s", "lr", "epochs"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ConfigError(f"{name} must be a positive number, got {v!r}")
        if not 0 < self.held_fraction < 1:
            raise ConfigError(f"held_fraction must be in (0, 1), got {self.held_fraction!r}")


class _Until(Deadline):
    """A deadline that also passes as soon as ``pause`` is set."""

    def __init__(self, budget_s: float | None, pause):
        super().__init__(budget_s)
        self.pause = pause

    def passed(self) -> bool:
        return super().passed() or (self.pause is not None and self.pause.is_set())


def split_history(records: list[Record], s: LearnSettings) -> tuple[list[Record], list[Record]]:
    """(training records, the guard's held-out slice: the newest ones)."""
    if len(records) < 2:
        return records, []
    held = min(s.held_max, max(s.held_min, round(s.held_fraction * len(records))),
               len(records) // 2)
    return records[: len(records) - held], records[len(records) - held :]


def last_trained(train_dir: Path) -> str:
    """The newest record the last run that trained could use ("" before any): the last run's
    report keeps it, and a run that stops before training carries the previous one over."""
    try:
        return str(json.loads((train_dir / "last_run.json").read_text())["data"]["trained_through"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def run(target, model_dir: Path, s: LearnSettings, *, pause=None, log=print) -> dict:
    """Learn from the records (see the module doc); returns the report."""
    t0 = time.perf_counter()
    fp = fingerprint(target)
    root = target_dir(fp)
    train_dir = private_dir(root / "train")
    deadline = _Until(s.budget_s, pause)
    report: dict = {"target": target.name, "fingerprint": fp, "settings": asdict(s)}
    records = RecordStore(root / "records").records()
    base = find_head(target, "eagle3")
    trainable = usable(target, records)
    active = _active(train_dir, trainable, base, s)
    by_name = {r.name: r for r in trainable}
    train_recs = [by_name[n] for n in active["train"]]
    held_recs = [by_name[n] for n in active["held"]]
    user_tokens = sum(r.answer_tokens for r in train_recs)
    report["data"] = {"records": len(records), "train_records": len(train_recs),
                      "held_records": len(held_recs), "train_answer_tokens": user_tokens,
                      "trained_through": last_trained(train_dir)}  # what `due` counts from
    report["corpus"] = _corpus(target, fp, records)
    if base is None:
        return _end(report, train_dir, "no eagle3 head to start from", t0, log)
    if user_tokens < s.min_answer_tokens or not held_recs:
        return _end(report, train_dir, f"waiting for more use: {user_tokens} answer tokens "
                    f"recorded for training, {s.min_answer_tokens} needed", t0, log)
    report["data"]["trained_through"] = trainable[-1].name  # this run trains on all up to it
    config, head = load_head(base, target)
    report["base"] = str(base)
    log(f"learning from {len(train_recs)} conversations ({user_tokens} answer tokens); "
        f"{len(held_recs)} newer ones held out for the guard; starting from {base}")
    replay, report["replay"] = replay_store(  # at most a third of the budget
        target, model_dir, root / "replay", s.replay_tokens,
        _Both(Deadline(0.35 * s.budget_s), deadline), config.aux_layers)
    if deadline.pause is not None and deadline.pause.is_set():
        return _end(report, train_dir, "paused", t0, log, keep=True)
    data = build(train_dir / f"data-{digest(train_recs, replay)}", train_recs, replay,
                 target.args.hidden_size, config.aux_layers)
    report["data"]["replay_sequences"] = data.meta["replay_sequences"]
    report["data"]["rows"] = data.tokens
    draft_ids = np.array(head.to_target_ids(np.arange(config.draft_vocab_size)))
    # the best top-1 the head's draft vocabulary allows on this user's answers
    report["data"]["draft_vocab_coverage"] = vocab_coverage(
        data, list(range(len(train_recs))), draft_ids, target.args.vocab_size)
    objective = Eagle3Objective(head, target, data, s.depths)
    user_seqs = list(range(len(train_recs)))
    check = user_seqs[::20]  # the trainer's own held-out metrics: every 20th conversation
    train_seqs = sorted(set(range(len(data))) - set(check))
    guard_s = 2 * sum(min(r.answer_tokens, s.guard_tokens) for r in held_recs) / 60 + 15
    plan = _plan(train_dir, objective, data, train_seqs, s, deadline, guard_s, active)
    report["plan"] = asdict(plan)
    if "before" not in active:  # the starting head on the trainer's held-out conversations
        held_w = trainer.windows(data, check, objective, s.window)
        active["before"] = trainer.evaluate(objective, held_w, s.batch_size) if held_w else {}
        write_json(train_dir / "active.json", active)
    result = trainer.train(objective, data, plan, train_dir / f"run-{active['id']}",
                           train_seqs=train_seqs, held_seqs=check, deadline=deadline)
    report["train"] = {k: v for k, v in result.items() if k != "history"}
    report["train"]["held_out_before"] = active["before"]
    if deadline.pause is not None and deadline.pause.is_set():
        return _end(report, train_dir, "paused", t0, log, keep=True)
    candidate = versions.candidate_dir(fp, "eagle3")
    save_head(candidate, config, head)
    log(f"guard: replaying {len(held_recs)} held-out prompts with the old and the new head")
    report["guard"] = compare(target, base, candidate, held_recs, s.guard_tokens, s.min_gain,
                              stop=lambda: pause is not None and pause.is_set())
    if report["guard"] is None:
        shutil.rmtree(candidate, ignore_errors=True)
        return _end(report, train_dir, "paused", t0, log, keep=True)
    info = {"base": str(base), "trained_on": report["data"], "train": report["train"],
            "guard": report["guard"], "decision": report["guard"]["decision"]}
    settle = versions.promote if report["guard"]["wins"] else versions.reject
    report["head"] = str(settle(fp, "eagle3", candidate, info))
    status = "promoted" if report["guard"]["wins"] else "rejected (kept aside, not used)"
    return _end(report, train_dir, status, t0, log)


class _Both(Deadline):
    def __init__(self, *deadlines):
        self.deadlines, self.at = deadlines, None

    def passed(self) -> bool:
        return any(d.passed() for d in self.deadlines)


def _active(train_dir: Path, records: list[Record], base, s: LearnSettings) -> dict:
    """The run in progress (same records still stored, same starting head), or a new one."""
    path = train_dir / "active.json"
    names = {r.name for r in records}
    try:
        have = json.loads(path.read_text())
        if (have["base"] == str(base) and set(have["train"]) | set(have["held"]) <= names
                and have["settings"] == asdict(s)):
            return have
    except (OSError, ValueError, KeyError):
        pass
    train, held = split_history(records, s)
    active = {"id": f"{time.time_ns():x}", "base": str(base), "settings": asdict(s),
              "train": [r.name for r in train], "held": [r.name for r in held]}
    for old in train_dir.glob("run-*"):  # an abandoned run's checkpoints
        shutil.rmtree(old, ignore_errors=True)
    write_json(path, active)
    return active


def _plan(train_dir: Path, objective, data, train_seqs, s: LearnSettings, deadline,
          guard_s: float, active: dict) -> trainer.Plan:
    """The run's plan (kept in ``active.json``): ``epochs`` passes, or fewer to fit the budget."""
    if "plan" in active:
        return trainer.Plan(**active["plan"])
    windows = trainer.windows(data, train_seqs, objective, s.window)
    steps = trainer.plan_steps(len(windows), s.batch_size, s.epochs, None)
    if deadline.at is not None:
        left = deadline.at - time.monotonic() - guard_s
        per_step = _probe(objective, windows, s)
        steps = max(1, min(steps, int(left / per_step)))
    plan = trainer.Plan(steps=steps, batch_size=s.batch_size, window=s.window, lr=s.lr,
                        warmup=max(1, steps // 20), weight_decay=0.0, clip=0.5, seed=s.seed,
                        eval_every=max(1, steps // 8), checkpoint_every=s.checkpoint_every)
    active["plan"] = asdict(plan)
    write_json(train_dir / "active.json", active)
    return plan


def _probe(objective, windows, s: LearnSettings) -> float:
    """Seconds per training step, timed on a copy of the head (its weights are not changed)."""
    import copy

    import mlx.optimizers as optim

    probe = copy.copy(objective)
    probe.module = copy.deepcopy(objective.module)
    opt = optim.AdamW(learning_rate=s.lr)
    step_fn, live = trainer.compiled_step(probe, opt, 0.5)
    times = []
    for i in range(4):
        batch = probe.batch(trainer.batch_at(i, windows, s.batch_size, s.seed))
        t = time.perf_counter()
        out = step_fn(batch)
        mx.eval(live, out)
        times.append(time.perf_counter() - t)
    return max(sum(times[1:]) / 3, 1e-3) * 1.1  # the first one traces the compiled step


def _corpus(target, fp: str, records: list[Record]) -> dict:
    """The recorded answers as the corpus's ``user`` source (a new corpus version)."""
    docs = []
    for r in records:
        _, tokens = r.arrays()
        docs.append([int(t) for t in tokens[r.meta["answer_row"] + 1 :]])
    docs = [d for d in docs if d]
    if not docs:
        return {"user_documents": 0}
    made_from = digest(records, None)
    now = learned_head(fp, "corpus")
    if now is not None and _learned_json(now).get("records_digest") == made_from:
        return {"user_documents": len(docs), "version": now.name, "unchanged": True}
    shipped = find_head(target, "corpus", learned=False)
    sources = dict(read_sources(shipped)[0]) if shipped is not None else {}
    sources["user"] = docs
    candidate = versions.candidate_dir(fp, "corpus")
    save_corpus(candidate, target, sources)
    final = versions.promote(fp, "corpus", candidate, {
        "decision": f"{len(docs)} recorded answers joined the corpus", "user_documents": len(docs),
        "shipped_corpus": str(shipped) if shipped else None, "records_digest": made_from})
    versions.prune(fp, "corpus", keep=2)  # the new corpus and the one it replaced
    return {"user_documents": len(docs), "user_tokens": sum(map(len, docs)), "version": final.name}


def _learned_json(path: Path) -> dict:
    try:
        return json.loads((path / "learned.json").read_text())
    except (OSError, ValueError):
        return {}


def _end(report: dict, train_dir: Path, status: str, t0: float, log, keep: bool = False) -> dict:
    report["status"] = status
    report["seconds"] = round(time.perf_counter() - t0, 1)
    if not keep:  # the run is over: its frozen split, checkpoints and data go
        for p in [*train_dir.glob("run-*"), *train_dir.glob("data-*")]:
            shutil.rmtree(p, ignore_errors=True)
        (train_dir / "active.json").unlink(missing_ok=True)
    write_json(train_dir / "last_run.json", report)
    log(f"learn run: {status} ({report['seconds']:.0f} s)")
    return report
