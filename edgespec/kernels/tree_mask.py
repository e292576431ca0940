"""TreeMask: what a tree (or chain) forward's attention may see, in the kernels' compact form.

Instead of the dense (N, L + N) boolean mask that ``tree.attention_mask`` builds, a TreeMask
carries a per-node ancestor bitmask (two uint32 words per node: N <= 64), the nodes' positions,
the position of the layer's key slot 0, how many cached keys precede the tree, and the window.
The Metal kernel (``kernels_metal/tree_attention.metal``) computes the mask from these; the
twin expands them with ``dense()``, which equals ``tree.attention_mask`` (``tests`` check it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import mlx.core as mx
import numpy as np

from ..tree import DraftTree

MAX_NODES = 64


@dataclass(frozen=True)
class TreeMask:
    anc: np.ndarray  # (N, 2) uint32: bit t of node i set when t is i or an ancestor of i
    qpos: np.ndarray  # (N,) int32: each node's absolute position
    key_start: int  # absolute position held in key slot 0
    cached: int  # L: cached keys before the tree's own N
    window: int | None

    @cached_property
    def device_arrays(self) -> tuple[mx.array, mx.array]:
        """(anc, qpos) as MLX arrays, made once: every layer's kernel call takes the same."""
        return mx.array(self.anc), mx.array(self.qpos)

    @cached_property
    def native_block(self) -> tuple[bool, bool]:
        """(whether float/quantized decoder blocks run as one native operation, whether a
        4-bit one takes int8 activations): the backend's choice (``kernels.backend``), asked
        once per mask, i.e. once per forward rather than once per layer."""
        from .backend import use_native_block, use_q8_activations

        return use_native_block(), use_q8_activations(4)

    @property
    def nodes(self) -> int:
        return len(self.qpos)

    def ancestors(self) -> np.ndarray:
        """(N, N) bool: [i, t] when t is i or an ancestor of i."""
        n = self.nodes
        bits = (self.anc[:, np.arange(n) // 32] >> (np.arange(n) % 32).astype(np.uint32)) & 1
        return bits.astype(bool)

    def dense(self) -> mx.array:
        """The boolean (N, L + N) mask the twin attends with (``tree.attention_mask``'s)."""
        key_pos = self.key_start + np.arange(self.cached)
        cached = np.ones((self.nodes, self.cached), dtype=bool)
        own = self.ancestors()
        if self.window is not None:
            cached &= (self.qpos[:, None] - key_pos[None, :]) < self.window
            own &= (self.qpos[:, None] - self.qpos[None, :]) < self.window
        return mx.array(np.concatenate([cached, own], axis=1))


def ancestor_bits(ancestors: np.ndarray) -> np.ndarray:
    """(N, N) bool -> (N, 2) uint32 words (N <= 64)."""
    n = ancestors.shape[0]
    words = np.zeros((n, 2), dtype=np.uint64)
    for t in range(n):
        words[:, t // 32] |= ancestors[:, t].astype(np.uint64) << np.uint64(t % 32)
    return words.astype(np.uint32)


def tree_mask(tree: DraftTree | None, n: int, key_start: int, offset: int,
              window: int | None) -> TreeMask:
    """The TreeMask of scoring ``tree`` (None: a chain of ``n`` tokens) after the committed
    keys at positions ``key_start .. offset - 1``; the root is at position ``offset``."""
    if n > MAX_NODES:
        raise ValueError(f"a TreeMask holds at most {MAX_NODES} nodes, got {n}")
    if tree is None:
        bits, depths = chain_bits(n), np.arange(n)
    else:
        bits, depths = ancestor_bits(tree.ancestor_mask()), tree.depths()
    return TreeMask(bits, (offset + depths).astype(np.int32), key_start, offset - key_start,
                    window)


@lru_cache(maxsize=MAX_NODES + 1)
def chain_bits(n: int) -> np.ndarray:
    """``ancestor_bits`` of a chain of ``n`` nodes (node i: bits 0..i), made once per length
    (read-only): a decoding step builds one per forward, and numpy's general path costs more
    than the forward's other host work."""
    bits = ancestor_bits(np.tril(np.ones((n, n), dtype=bool)))
    bits.flags.writeable = False
    return bits
