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
import numpy as np

from ..cache import KVCache
from ..errors import ConfigError
from ..kernels.backend import (SMALL_M_MAX, metal_kernels, native_enabled,
                               use_native_tree_attention)
from ..kernels.compact import gather_rows, move_rows
from ..kernels.tree_mask import MAX_NODES, tree_mask
from ..loading.tokenizer import Tokenizer
from ..tree import DraftTree, attention_mask, chain_mask
from .decoder import Decoder, DecoderArgs
from .state_cache import HybridCache

@dataclass
class TargetOutput:
    logits: mx.array | None  # (N, V); None when the head was not asked for
    hidden: mx.array  # (N, H), the last layer run, before the final norm
    captured: dict[int, mx.array] = field(default_factory=dict)  # layer id -> (N, H) entering it


class Target:
    def __init__(self, model: Decoder, tokenizer: Tokenizer, path: Path | None = None,
                 dtype: str = "float32", quantized: bool = False,
                 mtp_weights: dict[str, mx.array] | None = None):
        """``mtp_weights``: the checkpoint's multi-token-prediction layer (``mtp.*``, sanitized
        like the rest; none for most checkpoints), which ``targets/mtp.py`` builds the MTP
        drafter's layer from; the model itself loads without them."""
        self.model = model
        self.mtp_weights = mtp_weights or {}
        self.args: DecoderArgs = model.args
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

    def make_cache(self, layers: Sequence[int] | None = None) -> KVCache:
        """A cache for all layers, or for ``layers`` only (slot j for ``layers[j]``), with each
        layer's window and key/value source from the model's cache policy; a subset that runs a
        KV-shared layer must run its source too (ConfigError naming both)."""
        windows, sources = self.model.cache_windows(), self.model.kv_sources()
        layers = list(range(self.num_layers) if layers is None else layers)
        missing = {i: sources[i] for i in layers if sources[i] not in layers}
        if missing:
            raise ConfigError(
                f"layers {layers} run KV-shared layers without the layers whose keys/values they "
                f"read ({', '.join(f'{i} reads {s}' for i, s in missing.items())}); add those")
        kv = dict(window=[windows[i] for i in layers], gather=gather_rows, move=move_rows,
                  sources=[layers.index(sources[i]) for i in layers])
        recurrent = [j for j, i in enumerate(layers) if i in self.model.state_layers()]
        if recurrent:  # a hybrid model's recurrent layers keep states (``state_cache``)
            return HybridCache(len(layers), recurrent, **kv)
        return KVCache(len(layers), **kv)

    def exact_rows(self) -> int | None:
        """The most tokens one forward may score with each token's bits those of scoring it
        alone, which greedy speculation needs to reproduce plain decoding: ``SMALL_M_MAX`` where
        the native kernels run (the native block and the float small-M products stop there; a
        larger forward takes the blocks' module path and MLX's products, whose bits differ: with
        int8 activations by up to a logit, docs/measurements.md, "A verify of more than 32
        tokens"), else None (MLX's products decide the rows whatever the
        size). The engine keeps each step's tree within it."""
        return SMALL_M_MAX if native_enabled() else None

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
        ids, positions, masks = prepare(tokens, cache)
        n = len(ids)
        if hidden is not None and hidden.shape[0] != n:
            raise ValueError(f"hidden has {hidden.shape[0]} rows for {n} tokens")
        x, captured = self.model(
            (ids if isinstance(ids, mx.array) else mx.array(ids))[None],
            positions, masks, cache, layers, None if hidden is None else hidden[None], capture)
        x = x[0]
        return TargetOutput(self.logits(x) if head else None, x,
                            {i: h[0] for i, h in captured.items()})


def prepare(tokens: DraftTree | list[int] | mx.array, cache: KVCache) -> tuple:
    """What a forward over ``tokens`` (a chain or a tree after ``cache``'s tokens) needs: their
    ids, positions (an int for a chain, one per node for a tree) and one mask per cache slot;
    reserves their scratch slots in ``cache`` (``Target.score``; ``batched.score_many``)."""
    tree = tokens if isinstance(tokens, DraftTree) else None
    ids = tree.tokens if tree is not None else tokens
    n = len(ids)
    chain = tree is None or tree.is_chain
    # may drop entries that left the window: before the mask is built; a tree (a draft,
    # which may be accepted in part) also tells recurrent layers to keep every node's state
    cache.reserve(n, tree)
    positions = cache.offset if chain else cache.offset + tree.depths()
    return ids, positions, _masks(None if chain else tree, n, cache)


def _masks(tree: DraftTree | None, n: int, cache: KVCache) -> list:
    """One mask per cache slot, built once per distinct (window, oldest entry): the chain's or
    the tree's ancestors-only mask over the keys that slot's layer holds. Where the Metal
    kernels run (``kernels.backend.metal_kernels``), or the native CPU tree attention
    (``kernels.backend.use_native_tree_attention``), a forward over at most 64 tokens gets
    ``TreeMask``s instead (the tree attention kernel computes the mask from them)."""
    groups = cache.mask_groups()
    built: dict[tuple, object] = {}
    compact = n <= MAX_NODES and (metal_kernels() != "off" or use_native_tree_attention())
    for group in groups:
        if group not in built:
            window, start = group
            if compact:
                built[group] = tree_mask(tree, n, start, cache.offset, window)
            else:
                keys = np.arange(start, cache.offset)
                built[group] = (chain_mask(n, keys, cache.offset, window) if tree is None
                                else attention_mask(tree, keys, cache.offset, window))
    return [built[group] for group in groups]
