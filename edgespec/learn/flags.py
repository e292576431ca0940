"""The chat's and serve's learning flags, and the :class:`Learning` they ask for.

``--learn/--no-learn`` (default on; ``EDGESPEC_LEARN=0`` also turns it off), ``--learn-budget-mb``
(the recordings' disk budget) and ``--learn-when-idle`` (fine-tune after a while without a
request). ``learning_from(surface, learn, budget_mb, when_idle)`` is the worker's ``Learning``, or
None when learning is off.
"""

from __future__ import annotations

import click

from .session import IDLE_AFTER_S, Learning, learning_on
from .store import DEFAULT_BUDGET_MB

HELP = {
    "learn": "record what decoding computes anyway (the drafter's training features and the "
             "tokens, under ~/.cache/edgespec/learn, on this machine only), so `edgespec learn "
             "run` can fit the drafter to your use; --no-learn or EDGESPEC_LEARN=0 turns it off "
             "[default: on]",
    "learn_budget_mb": "disk budget of the recordings, in MiB; the oldest are deleted first "
                       f"[default: {DEFAULT_BUDGET_MB}]",
    "learn_when_idle": f"fine-tune the drafter on the recordings after {IDLE_AFTER_S:.0f} s "
                       "without a request, pausing at once when one arrives",
}


def learn_options(fn):
    """Decorator: the three learning flags."""
    fn = click.option("--learn-when-idle", is_flag=True, default=False,
                      help=HELP["learn_when_idle"])(fn)
    fn = click.option("--learn-budget-mb", default=DEFAULT_BUDGET_MB, type=click.IntRange(1),
                      help=HELP["learn_budget_mb"])(fn)
    return click.option("--learn/--no-learn", "learn", default=None, help=HELP["learn"])(fn)


def learning_from(surface: str, learn: bool | None, budget_mb: int = DEFAULT_BUDGET_MB,
                  when_idle: bool = False) -> Learning | None:
    if not learning_on(learn, default=True):
        return None
    return Learning(surface, budget_mb=budget_mb, when_idle=when_idle)
