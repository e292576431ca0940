"""Time in ``edgespec train``: the time budget every phase checks, and seconds per phase.

Contract: every phase reads the time through ``now()`` (one place, so a test can replace it) and
stops at its next safe point (a finished record, sequence or step) once ``Deadline.passed()``.
``PhaseTimes`` keeps this run's seconds per phase and the sum over all runs in the work dir
(``timings.json``), so a resumed run still reports what the whole recipe cost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path


def now() -> float:
    return time.monotonic()


class Deadline:
    """``budget_s`` seconds from now (None: never)."""

    def __init__(self, budget_s: float | None):
        self.at = None if budget_s is None else now() + budget_s

    def passed(self) -> bool:
        return self.at is not None and now() >= self.at


def passed(deadline: Deadline | None) -> bool:
    return deadline is not None and deadline.passed()


class PhaseTimes:
    def __init__(self, folder: Path):
        self.path = Path(folder) / "timings.json"
        self.total: dict[str, float] = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.run: dict[str, float] = {}

    def timed(self, phase: str, fn: Callable):
        """``fn()``, its wall time added to ``phase`` (also when it raises)."""
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            dt = time.perf_counter() - t0
            self.run[phase] = round(self.run.get(phase, 0.0) + dt, 1)
            self.total[phase] = round(self.total.get(phase, 0.0) + dt, 1)
            self.path.write_text(json.dumps(self.total, indent=1))
