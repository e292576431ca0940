"""Scoring several sequences in one target forward: each with its own cache, tree and context.

Contract: ``score_many(target, parts)`` returns, for each :class:`Part`, what
``target.score(part.tokens, part.cache, capture=part.capture)`` returns, and leaves each cache
as that call would (its rows in its scratch slots, nothing committed). Where the whole forward
can run through the native decoder block (``can_share``), the sequences' rows go through every
block as one operation (``native/block.h``: the four products read each weight once for all
rows; each sequence attends to its own cache under its own tree mask), all the blocks as one
operation that writes each cache in place where every cache can give its buffers up
(``Decoder.run_many``), and the LM head takes all rows at once. Every step of that operation is computed row by row, so each row gets the
bits it gets when its sequence is scored alone. Elsewhere (models whose blocks do not all run
natively, hybrid caches, sliding windows, Metal, more rows than the native block takes) the
parts are scored one after another: the same results, without the sharing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..cache import KVCache
from ..kernels.backend import (SMALL_M_MAX, metal_kernels, use_native_block,
                               use_native_tree_attention)
from ..kernels.matmul import linear_rows_exact
from ..tree import DraftTree
from .target import Target, TargetOutput, prepare


@dataclass
class Part:
    """One sequence's share of a forward: a chain or tree after ``cache``'s committed tokens."""

    tokens: DraftTree | list[int]
    cache: KVCache
    capture: tuple[int, ...] = ()

    @property
    def ids(self) -> list[int]:
        return list(self.tokens.tokens if isinstance(self.tokens, DraftTree) else self.tokens)


def can_share(target: Target, parts: Sequence[Part]) -> bool:
    """Whether ``parts`` can be scored in one native forward (see the module docstring)."""
    if len(parts) < 2 or sum(len(p.ids) for p in parts) > SMALL_M_MAX:
        return False
    if metal_kernels() != "off" or not use_native_tree_attention() or not use_native_block():
        return False
    if not target.model.native_blocks():
        return False
    for p in parts:
        c = p.cache
        if type(c) is not KVCache or c.num_layers != target.num_layers or len(set(c.mask_groups())) != 1:
            return False
    return True


def score_many(target: Target, parts: Sequence[Part]) -> list[TargetOutput]:
    """Score every part (see the module docstring)."""
    if not can_share(target, parts):
        return [target.score(p.tokens, p.cache, capture=p.capture) for p in parts]
    masks, caches, rows = [], [], []
    for p in parts:
        ids, _, part_masks = prepare(p.tokens, p.cache)
        masks.append(part_masks[0])  # one mask group (``can_share``): a TreeMask (<= 32 nodes)
        caches.append(p.cache)
        rows.append(len(ids))
    tokens = mx.array(np.concatenate([np.asarray(p.ids, dtype=np.int32) for p in parts]))[None]
    capture = sorted({i for p in parts for i in p.capture})
    x, captured = target.model.run_many(tokens, masks, caches, capture)
    x = x[0]
    shared = target.logits(x) if _head_rows_exact(target, rows) else None
    outs, a = [], 0
    for p, n in zip(parts, rows):
        h = x[a : a + n]
        logits = shared[a : a + n] if shared is not None else target.logits(h)
        outs.append(TargetOutput(logits, h, {i: captured[i][0, a : a + n] for i in p.capture}))
        a += n
    return outs


def _head_rows_exact(target: Target, rows: list[int]) -> bool:
    """Whether the LM head over all rows gives each sequence's rows the bits of its own call:
    a native kernel (row by row) runs for every part's row count and for the total. Where the
    backend picks MLX's product for some count (small heads), each part takes its own."""
    head = target.model.output_head()
    return all(linear_rows_exact(head, m) for m in [*rows, sum(rows)])
