"""Target: a loaded model + tokenizer, and the one scoring path every caller uses.

``Target.score(tokens_or_tree, cache)`` -> :class:`TargetOutput` scores new tokens (a chain
following the cache, or a :class:`DraftTree` whose root follows it) against the cache: it
reserves the scratch slots, derives positions and the attention mask from the cache and the
tree, and runs the layers. It never commits: the cache's owner (the engine for the target's
cache, a drafter for its own) calls ``commit``/``trim`` afterwards.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

from ..cache import KVCache
from ..loading.tokenizer import Tokenizer
from ..tree import DraftTree, attention_mask, chain_mask
from .llama import Model, ModelArgs

@dataclass
class TargetOutput:
    logits: mx.array | None  # (N, V); None when the head was not asked for
    hidden: mx.array  # (N, H), the last layer run, before the final norm
    captured: dict[int, mx.array] = field(default_factory=dict)  # layer id -> (N, H) entering it


class Target:
    def __init__(self, model: Model, tokenizer: Tokenizer, path: Path | None = None,
                 dtype: str = "float32", quantized: bool = False):
        self.model = model
        self.args: ModelArgs = model.args
        self.tokenizer = tokenizer
        self.path = path
        self.dtype = dtype
        self.quantized = quantized

    @property
    def name(self) -> str:
        return self.path.name if self.path else "model"

    @property
    def num_layers(self) -> int:
        return self.args.num_hidden_layers

    @property
    def context_length(self) -> int:
        return self.args.max_position_embeddings

    def make_cache(self) -> KVCache:
        return KVCache(self.num_layers, window=self.args.sliding_window)

    def logits(self, hidden: mx.array) -> mx.array:
        """Final norm + LM head over hidden states (..., H) of the last layer."""
        return self.model.logits(hidden)

    def score(self, tokens: DraftTree | list[int] | mx.array, cache: KVCache, *,
              layers: Sequence[int] | None = None, hidden: mx.array | None = None,
              capture: Collection[int] = (), head: bool = True) -> TargetOutput:
        """Score new tokens against ``cache``: a chain (ids following the cache's tokens) or a
        tree (its root follows them; positions = offset + depth, ancestors-only mask).

        Writes the tokens' keys/values into the cache's scratch slots and commits nothing.
        ``layers`` runs only those layers (increasing ids; see ``Model.__call__`` for the cache
        slots), starting from ``hidden`` (N, H) instead of the embedding when given; ``capture``
        returns the hidden state entering each listed layer; ``head=False`` skips the LM head.
        """
        tree = tokens if isinstance(tokens, DraftTree) else None
        ids = tree.tokens if tree is not None else tokens
        n = len(ids)
        cache.reserve(n)  # may drop entries that left the window: before the mask is built
        if tree is None or tree.is_chain:
            positions = cache.offset
            mask = chain_mask(n, cache.key_positions(), cache.offset, cache.window)
        else:
            positions = cache.offset + tree.depths()
            mask = attention_mask(tree, cache.key_positions(), cache.offset, cache.window)
        if hidden is not None and hidden.shape[0] != n:
            raise ValueError(f"hidden has {hidden.shape[0]} rows for {n} tokens")
        x, captured = self.model(
            None if hidden is not None else (ids if isinstance(ids, mx.array) else mx.array(ids))[None],
            positions, mask, cache, layers, None if hidden is None else hidden[None], capture)
        x = x[0]
        return TargetOutput(self.logits(x) if head else None, x,
                            {i: h[0] for i, h in captured.items()})
