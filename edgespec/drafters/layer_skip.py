"""Layer skip (Draft & Verify-style self-draft): the target drafts through a searched subset of its
layers with middle layers skipped (``calibrate.search_layer_subset`` finds it). It cannot reuse
the target's KV as early exit does: a layer after a skipped one sees another input than in the
target."""

from __future__ import annotations

from collections.abc import Sequence

from ..config import SamplingConfig
from ..targets.target import Target
from .layer_subset import SubsetDrafter


class LayerSkipDrafter(SubsetDrafter):
    """Drafts through ``layers`` of the target (Draft & Verify).

    With ``confidence`` > 0 the chain runs up to ``max_draft`` tokens and ends after the first
    draft whose top probability is under ``confidence``; with 0 it is ``num_draft`` long
    (adaptive when ``adaptive``).
    """

    name = "layer-skip"

    def __init__(self, target: Target, sampling: SamplingConfig, layers: Sequence[int],
                 num_draft: int = 4, max_draft: int = 12, confidence: float = 0.6,
                 adaptive: bool = True):
        super().__init__(target, layers, sampling, num_draft, max_draft, adaptive, confidence)
