"""LowerLayers: the target's own first layers, lent by the engine to a drafter that drafts with them.

Early exit drafts with the target's first E layers (+ final norm + head). Those layers of a token
are the same computation for draft and target, so the draft runs them inside the target's own
cache and verification runs only layers E..L-1 over the stored hidden states: E/L of every
verification, the draft's prefill and its KV cache are saved.

The engine owns the target's cache and this object: each step it calls ``begin`` (room for the
step's nodes), the drafter calls ``feed`` once per tree node in node order (the root first, the
last draft too) and reads logits with ``logits``; the engine then calls ``score(tree)``, which
drops the provisional slots from the committed length (their values stay in the scratch slots
where the tree's nodes go) and runs the upper layers. Only chains can be fed this way: node i's
lower layers attend to nodes < i.
"""

from __future__ import annotations

import mlx.core as mx

from ..cache import KVCache
from ..tree import DraftTree


class LowerLayers:
    def __init__(self, target, cache: KVCache, layers: int):
        if not 1 <= layers <= target.num_layers:
            raise ValueError(f"lower layers must be in [1, {target.num_layers}], got {layers}")
        self.target, self.cache, self.layers = target, cache, layers
        self.tokens: list[int] = []
        self.hidden: list[mx.array] = []

    def begin(self, nodes: int) -> None:
        """Start a step that feeds at most ``nodes`` nodes (a sliding window compacts now,
        before any slot is filled)."""
        self.cache.reserve(nodes)
        self.cache.hold()  # the feeds are committed one by one and trimmed back over
        self.tokens, self.hidden = [], []

    def feed(self, token: int) -> mx.array:
        """Run ``token`` (the next node of the chain) through the lower layers; returns the
        hidden state entering layer ``layers``, shape (1, H)."""
        out = self.target.score([token], self.cache, layers=range(self.layers), head=False)
        self.cache.commit()  # provisional, so the next node attends to it; undone in ``score``
        self.tokens.append(token)
        self.hidden.append(out.hidden)
        return out.hidden

    def logits(self, hidden: mx.array) -> mx.array:
        """The target's final norm + LM head over ``hidden`` (the early-exit draft's head)."""
        return self.target.logits(hidden)

    @property
    def fed(self) -> bool:
        return bool(self.tokens)

    def drop(self) -> None:
        """Forget the fed nodes (their provisional slots leave the committed length): the engine
        verifies another tree than the fed chain, scoring it through every layer."""
        self.cache.trim(len(self.tokens))
        self.tokens, self.hidden = [], []

    def score(self, tree: DraftTree):
        """Verification of a tree whose nodes were all fed: the upper layers only."""
        assert self.tokens == tree.tokens and tree.is_chain, "fed nodes must be the tree's chain"
        self.cache.trim(len(self.tokens))  # back to the committed history; slots keep their values
        hidden = mx.concatenate(self.hidden, axis=0)
        self.tokens, self.hidden = [], []
        return self.target.score(tree, self.cache, layers=range(self.layers, self.target.num_layers),
                                 hidden=hidden)
