"""Learning as a surface uses it: whether it is on, the recorder a worker's engine gets, and
learning while the worker is idle.

Contract:
- ``learning_on(flag, default)``: ``--no-learn`` (flag False) or ``EDGESPEC_LEARN=0`` turn it
  off; otherwise ``flag`` if given, else the surface's default (on for ``chat`` and ``serve``,
  off for ``bench`` and the Python API unless asked).
- :class:`Learning` is what a ``Worker`` is given. Once the model is loaded (on the worker's
  thread) ``attach(target)`` returns the :class:`Recorder` for its engine: the feature layers of
  the EAGLE-3 head in use (the recipe's default layers without one), the target's record store
  with its byte budget.
- With ``when_idle``, the worker calls ``idle(target, model_dir)`` on its own thread after no
  request has arrived for ``idle_after_s`` seconds; it runs ``learn.run`` (budget
  ``idle_budget_s``) when there is a paused run to finish or a run would train (``due``: enough
  answer tokens to train on, that many new since the last run that trained). ``pause`` is
  cleared by the worker before it starts waiting for a request and set as soon as one is
  submitted: training stops at its next step (with a checkpoint), the guard between prompts,
  and the request runs; the next idle spell resumes the run.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..heads.config import HeadConfig, fingerprint
from ..heads.find import find_head
from ..heads.learned import target_dir
from .recorder import Recorder
from .store import DEFAULT_BUDGET_MB, RecordStore

log = logging.getLogger("edgespec.learn")
IDLE_AFTER_S = 120.0
IDLE_BUDGET_S = 1200.0


def learning_on(flag: bool | None, default: bool) -> bool:
    """Whether a surface records (see the module doc)."""
    if os.environ.get("EDGESPEC_LEARN", "").strip().lower() in ("0", "false", "no", "off"):
        return False
    return default if flag is None else bool(flag)


def aux_layers(target) -> tuple[int, ...]:
    """The feature layers of the EAGLE-3 head in use, else the recipe's default ones."""
    path = find_head(target, "eagle3")
    if path is not None:
        try:
            section = json.loads((path / "config.json").read_text()).get("edgespec", {})
            if section.get("aux_layers"):
                return tuple(int(i) for i in section["aux_layers"])
        except (OSError, ValueError, TypeError):
            pass
    return tuple(HeadConfig.for_target(target, "eagle3").aux_layers)


def usable(target, records: list) -> list:
    """The records a run can train on: those made with the feature layers of the head in use
    (records made under a head with other layers hold other features)."""
    layers = list(aux_layers(target))
    return [r for r in records if r.meta.get("aux_layers") == layers]


def record_store(target, budget_mb: int = DEFAULT_BUDGET_MB) -> RecordStore:
    return RecordStore(target_dir(fingerprint(target)) / "records", budget_mb * 2**20)


@dataclass
class Learning:
    """How a worker learns (see the module doc)."""

    surface: str
    budget_mb: int = DEFAULT_BUDGET_MB
    when_idle: bool = False
    idle_after_s: float = IDLE_AFTER_S
    idle_budget_s: float = IDLE_BUDGET_S
    min_answer_tokens: int = 2000
    pause: threading.Event = field(default_factory=threading.Event)
    recorder: Recorder | None = None
    last: dict | None = None  # the last idle run's report

    def attach(self, target) -> Recorder:
        self.recorder = Recorder(record_store(target, self.budget_mb), aux_layers(target),
                                 self.surface)
        return self.recorder

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()

    def due(self, target) -> bool:
        """A paused run to finish, or a run that would train: as ``learn.run`` counts, at least
        ``min_answer_tokens`` answer tokens in the training split of the usable records (those
        with the head's feature layers), and that many recorded since the last run that trained.
        A run that found too little data does not restart the count, and one that trained is not
        repeated on the same records."""
        from .run import LearnSettings, last_trained, split_history

        root = target_dir(fingerprint(target))
        if (root / "train" / "active.json").is_file():
            return True
        records = usable(target, record_store(target, self.budget_mb).records())
        settings = LearnSettings(min_answer_tokens=self.min_answer_tokens)
        train, held = split_history(records, settings)
        if not held or sum(r.answer_tokens for r in train) < self.min_answer_tokens:
            return False
        # by name (age), not count: a full store drops one old record for each new one
        since = last_trained(root / "train")
        return sum(r.answer_tokens for r in records if r.name > since) >= self.min_answer_tokens

    def idle(self, target, model_dir: Path | None) -> dict | None:
        """One idle spell's learning (on the worker's thread), or None when nothing is due."""
        from .run import LearnSettings, run

        if self.recorder is not None:
            self.recorder.flush()
        if model_dir is None or self.pause.is_set() or not self.due(target):
            return None
        log.info("learning while idle (a request pauses it)")
        settings = LearnSettings(budget_s=self.idle_budget_s,
                                 min_answer_tokens=self.min_answer_tokens)
        try:
            self.last = run(target, model_dir, settings, pause=self.pause, log=log.info)
        except Exception:  # noqa: BLE001 - learning must never take the server down
            log.exception("learning while idle failed")
            self.last = {"status": "failed"}
        return self.last
