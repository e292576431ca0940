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
  ``idle_budget_s``) when there is a paused run to finish or at least ``min_answer_tokens`` new
  answer tokens since the last run. ``pause`` is cleared by the worker before it starts waiting
  for a request and set as soon as one is submitted: training stops at its next step (with a checkpoint), the guard between prompts, and
  the request runs; the next idle spell resumes the run.
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
        """A paused run to finish, or enough new answer tokens since the last run."""
        root = target_dir(fingerprint(target))
        if (root / "train" / "active.json").is_file():
            return True
        try:  # by name (age), not count: a full store drops one old record for each new one
            last = json.loads((root / "train" / "last_run.json").read_text())
            newest = str(last["data"]["newest"])
        except (OSError, ValueError, KeyError, TypeError):
            newest = ""
        new = [r for r in record_store(target, self.budget_mb).records() if r.name > newest]
        return sum(r.answer_tokens for r in new) >= self.min_answer_tokens

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
