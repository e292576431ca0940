"""Drafting methods. Each implements the Drafter protocol of ``base.py``."""

from __future__ import annotations

from ..config import SamplingConfig, SpecConfig
from ..models.target import Target
from .auto import AutoDrafter
from .base import AdaptiveLength, Drafter
from .draft_model import DraftModelDrafter, check_vocabularies
from .lookahead import LookaheadDrafter
from .lookup import PromptLookupDrafter


def make_drafter(spec: SpecConfig, target: Target, sampling: SamplingConfig | None = None,
                 draft: Target | None = None) -> Drafter | None:
    """The drafter for ``spec.method`` (None for plain decoding).

    ``draft`` is an already loaded draft model; otherwise ``spec.draft`` is loaded.
    """
    sampling = sampling or SamplingConfig()
    if spec.method == "none":
        return None
    if spec.method == "draft":
        from ..models import load

        draft = draft or load(spec.draft, dtype=target.dtype if target.dtype != "native" else None)
        check_vocabularies(target, draft)
        return DraftModelDrafter(draft, sampling, spec.num_draft, spec.max_draft, spec.adaptive,
                                 vocab_size=target.args.vocab_size)
    if spec.method == "lookup":
        return PromptLookupDrafter(num_draft=spec.num_draft, max_draft=spec.max_draft)
    if spec.method == "lookahead":
        return LookaheadDrafter()
    if spec.method == "auto":
        arms = {"none": None, "lookup": PromptLookupDrafter(max_draft=spec.max_draft)}
        if spec.draft or draft is not None:
            sub = SpecConfig(method="draft", draft=spec.draft or "-", num_draft=spec.num_draft,
                             max_draft=spec.max_draft, adaptive=spec.adaptive)
            arms["draft"] = make_drafter(sub, target, sampling, draft=draft)
        return AutoDrafter(arms)
    raise AssertionError(f"SpecConfig accepted unknown method {spec.method!r}")


__all__ = ["AdaptiveLength", "AutoDrafter", "DraftModelDrafter", "Drafter", "LookaheadDrafter", "PromptLookupDrafter", "check_vocabularies", "make_drafter"]
