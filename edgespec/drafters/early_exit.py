"""Early exit (LayerSkip-style self-draft): the target's first E layers + final norm + head draft.

KV reuse: the drafter declares ``lower_layers = E``, and under the engine it drafts through the
:class:`~edgespec.targets.lower_layers.LowerLayers` the engine lends it: every node (the last
draft too) runs through layers < E inside the target's own cache, and the engine verifies only
layers E..L-1. That saves E/L of each verification, the draft's own prefill and its KV cache.
Used on its own (no engine lending), it drafts like any layer subset, with its own cache.
On the demo model (not trained for early exit) calibration finds that no E pays.
"""

from __future__ import annotations

import numpy as np

from ..config import SamplingConfig
from ..errors import ConfigError
from ..targets.target import Target, TargetOutput
from ..targets.lower_layers import LowerLayers
from ..tree import DraftTree
from ..verify import Accepted
from .layer_subset import SubsetDrafter


class EarlyExitDrafter(SubsetDrafter):
    """Drafts with the target's first ``exit_layer`` layers + final norm + head (LayerSkip)."""

    name = "early-exit"

    def __init__(self, target: Target, sampling: SamplingConfig, exit_layer: int,
                 num_draft: int = 4, max_draft: int = 12, adaptive: bool = True):
        L = target.num_layers
        if isinstance(exit_layer, bool) or not isinstance(exit_layer, int) or not 1 <= exit_layer <= L:
            raise ConfigError(f"exit_layer must be an integer in [1, {L}] "
                              f"({target.name} has {L} layers), got {exit_layer!r}")
        super().__init__(target, range(exit_layer), sampling, num_draft, max_draft, adaptive)
        self.lower_layers = self.exit_layer = exit_layer
        self.lower: LowerLayers | None = None

    def use_lower_layers(self, lower: LowerLayers | None) -> None:
        self.lower = lower

    def prefill(self, tokens: list[int], target_out: TargetOutput | None,
                sampling: SamplingConfig | None = None) -> None:
        if self.lower is None:
            return super().prefill(tokens, target_out, sampling)
        self._start(tokens, sampling)  # the target's prefill already holds layers < E

    def propose(self, budget: int) -> DraftTree:
        if self.lower is None:
            return super().propose(budget)
        k, root = min(self._longest(), budget), self.history[-1]
        if k <= 0:
            return DraftTree.chain(root, [])
        lower = self.lower
        drafts, qs, token, stop = [], [], root, False
        while True:  # every node is fed once (the last draft too: the verifier needs it)
            hidden = lower.feed(token)
            if len(drafts) == k or stop:
                break
            logits = lower.logits(hidden)[0]
            token, q = self._choose(logits, len(drafts))
            drafts.append(token)
            qs.append(q)
            stop = self._stop_after(logits)
        q_rows = None if self.sampling.greedy else np.stack(qs + [np.zeros_like(qs[0])])
        return DraftTree.chain(root, drafts, q_rows)

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput) -> None:
        if self.lower is None:
            return super().update(accepted, tree, target_out)
        self.history.extend(accepted.tokens)
        self.length.observe(tree.num_drafted, accepted.num_accepted)
