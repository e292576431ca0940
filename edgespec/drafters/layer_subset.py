"""Self-drafting through a subset of the target's own layers (no copy of its weights).

:class:`LayerSubset` runs the target's weights through some of its layers, then its final norm
and LM head; :class:`SubsetDrafter` is the draft-model drafter (``draft_model.py``) over one,
optionally ending its chain when the draft's top probability falls under ``confidence``
(whether a node gets a child depends only on its prefix, so this stays lossless). The two
methods built on it are ``early_exit.py`` and ``layer_skip.py``; ``calibrate.py`` chooses their
layers or says that none pays.

The drafter's KV cache is its own and has one slot per layer it runs (slot j holds layer
``layers[j]``, with that layer's window: ``Target.make_cache(layers)``), so no slot is kept for
a layer that never runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from ..cache import KVCache
from ..config import SamplingConfig
from ..errors import ConfigError
from ..targets.target import Target, TargetOutput
from .draft_model import DraftModelDrafter


class LayerSubset:
    """The target's weights through ``layers`` (increasing ids), then final norm + LM head.

    Offers what DraftModelDrafter uses of a Target: ``score``, ``make_cache`` and ``name``.
    """

    def __init__(self, target: Target, layers: Sequence[int]):
        layers, L = list(layers), target.num_layers
        if not layers or layers != sorted(set(layers)) or not 0 <= layers[0] <= layers[-1] < L:
            raise ConfigError(f"layers must be distinct increasing layer ids in [0, {L}) "
                              f"({target.name} has {L} layers), got {layers!r}")
        self.target, self.layers = target, layers

    @property
    def name(self) -> str:
        return f"{self.target.name}[{len(self.layers)} of {self.target.num_layers} layers]"

    def make_cache(self) -> KVCache:
        return self.target.make_cache(self.layers)

    def score(self, tokens, cache: KVCache) -> TargetOutput:
        """``Target.score`` through these layers; ``cache`` comes from ``make_cache``."""
        return self.target.score(tokens, cache, layers=self.layers)


class SubsetDrafter(DraftModelDrafter):
    """DraftModelDrafter over a LayerSubset; optionally ends the chain on low confidence."""

    def __init__(self, target: Target, layers: Sequence[int], sampling: SamplingConfig,
                 num_draft: int, max_draft: int, adaptive: bool, confidence: float = 0.0):
        if not 0.0 <= confidence < 1.0:
            raise ConfigError(f"confidence must be in [0, 1) (0 = off), got {confidence!r}")
        super().__init__(LayerSubset(target, layers), sampling, num_draft, max_draft, adaptive,
                         vocab_size=target.args.vocab_size)
        self.layers = self.draft.layers
        self.confidence = confidence

    def _longest(self) -> int:
        return self.length.maximum if self.confidence else self.length.k  # confidence decides

    def _stop_after(self, logits: mx.array) -> bool:
        return bool(self.confidence) and _top_prob(logits) < self.confidence


def _top_prob(logits: mx.array) -> float:
    return float(mx.max(mx.softmax(logits.astype(mx.float32))).item())
