"""Drafting methods: one file per method, each implementing the Drafter protocol of ``base.py``.

``registry.py`` holds a builder per method of ``edgespec/methods.py`` and the one factory,
``make_drafter``; ``default.py`` the method used when none is named. Importing the registry
imports no drafter (each builder imports its method's file when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .registry import METHODS, NAMES, Method, make_drafter

if TYPE_CHECKING:
    from ..targets.target import Target


def load_draft(ref: str, target: Target, progress: bool = True) -> Target:
    """Load a draft model in the target's dtype and check that it shares the target's vocabulary."""
    from ..targets import load
    from .draft_model import check_vocabularies

    draft = load(ref, dtype=target.dtype if target.dtype != "native" else None, progress=progress)
    check_vocabularies(target, draft)
    return draft


__all__ = ["METHODS", "NAMES", "Method", "load_draft", "make_drafter"]
