"""Early exit (LayerSkip-style self-draft): the target's first E layers + final norm + head draft.

KV reuse: under the engine, :class:`EarlyExitDrafter` drafts inside the target's own cache
(``share_cache``). Layers < E of a token are the same computation for draft and target, so the
draft writes their keys/values into the target cache's scratch slots, feeds every node (the
last draft too) and hands the verifier the hidden state entering layer E in ``tree.reuse``;
``Target.forward`` then runs layers E..L-1 only and ``commit(path)`` keeps the accepted nodes'
slots in every layer. That saves E/L of each verification, the draft's own prefill and its KV
cache. On the demo model (not trained for early exit) calibration finds that no E pays.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..cache import KVCache
from ..config import SamplingConfig
from ..errors import ConfigError
from ..targets.target import Target, TargetOutput
from ..tree import DraftTree, LayerReuse, chain_mask
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
        self.exit_layer = exit_layer
        self.target = target
        self.shared: KVCache | None = None

    def share_cache(self, cache: KVCache) -> None:
        """Draft inside the target's own cache (the engine calls this before ``prefill``).

        The first E layers of a token are the same computation for draft and target, so the
        draft writes their keys/values straight into the target cache's scratch slots and hands
        the verifier the hidden state entering layer E (``tree.reuse``); verification then runs
        layers E..L-1 only. Nothing is prefilled for the draft (the target's prefill already
        holds layers < E), and the draft keeps no cache of its own.
        """
        self.shared = cache

    def prefill(self, tokens: list[int], target_out: TargetOutput | None,
                sampling: SamplingConfig | None = None) -> None:
        if self.shared is None:
            return super().prefill(tokens, target_out, sampling)
        self._start(tokens, sampling)

    def _lower(self, token: int) -> mx.array:
        """Run ``token`` through layers < E in the shared cache, committing its slot (the caller
        trims). Returns the hidden state entering layer E, shape (1, H)."""
        cache = self.shared
        cache.reserve(1)
        mask = chain_mask(1, cache.key_positions(), cache.offset, cache.window)
        x = self.target.model(mx.array([[token]]), cache.offset, mask, cache,
                              layers=range(self.exit_layer))
        cache.commit()
        return x[0]

    def propose(self, budget: int) -> DraftTree:
        if self.shared is None:
            return super().propose(budget)
        k, root = min(self._longest(), budget), self.history[-1]
        if k <= 0:
            return DraftTree.chain(root, [])
        cache = self.shared
        cache.reserve(k + 1)  # a sliding window compacts now, not after the slots are filled
        hidden, drafts, qs, token, stop = [], [], [], root, False
        while True:  # every node is fed once (the last draft too: the verifier needs it)
            hidden.append(self._lower(token))
            if len(drafts) == k or stop:
                break
            logits = self.target.model.logits(hidden[-1])[0]
            token, q = self._choose(logits)
            drafts.append(token)
            qs.append(q)
            stop = self._stop_after(logits)
        cache.trim(len(hidden))  # back to the committed history; the slots keep their values
        q_rows = None if self.sampling.greedy else np.stack(qs + [np.zeros_like(qs[0])])
        tree = DraftTree.chain(root, drafts, q_rows)
        tree.reuse = LayerReuse(self.exit_layer, mx.concatenate(hidden, axis=0))
        return tree

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput) -> None:
        if self.shared is None:
            return super().update(accepted, tree, target_out)
        self.history.extend(accepted.tokens)
        self.length.observe(tree.num_drafted, accepted.num_accepted)
