"""Medusa-1 heads: K heads over the target's normed last hidden state, head i predicting the token
at t+2+i.

Head i = ``num_layers`` residual blocks ``x + SiLU(linear(x))`` (H -> H, with bias; weight and bias
zero-initialised, so a new head starts as the identity), then an LM head: its own Linear(H, V) (initialised from the
target's) or the target's own head, frozen (``own_lm_head=False``: K x H x V fewer weights, one
shared matrix). Labels: head i at position t learns the target's argmax at position t+1+i.

**A draft vocabulary** (heads sharing the target's LM head only; ``set_draft_vocab``): the heads
then propose only ``draft_ids`` (the most frequent target tokens of the training answers, like
EAGLE-3's), reading those rows of the shared LM head: on the demo model 8,192 of 49,152 rows, so
a draft step's LM head and top-k cost a sixth, and training's loss too (labels outside it are
left out of the loss and count as misses). The rows are the target's own, so a head trained
with the full vocabulary can draft with any subset and vice versa.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..errors import HeadError
from ..kernels.activations import silu
from .config import HeadConfig, vocab_index


class ResBlock(nn.Module):
    def __init__(self, dims: int):
        super().__init__()
        self.linear = nn.Linear(dims, dims)
        self.linear.weight = mx.zeros_like(self.linear.weight)
        self.linear.bias = mx.zeros_like(self.linear.bias)  # SiLU(0) = 0: the block starts as x

    def __call__(self, x: mx.array) -> mx.array:
        return x + silu(self.linear(x))


class MedusaHead(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.blocks = [ResBlock(c.hidden_size) for _ in range(c.num_layers)]
        if c.own_lm_head:
            self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def __call__(self, x: mx.array, target_head: Callable | None) -> mx.array:
        for block in self.blocks:
            x = block(x)
        return self.lm_head(x) if "lm_head" in self else target_head(x)


class MedusaHeads(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        self.heads = [MedusaHead(config) for _ in range(config.num_heads)]
        self._ids: np.ndarray | None = None  # the draft vocabulary (underscored: not a parameter)
        self._index: mx.array | None = None

    # -- the draft vocabulary

    def set_draft_vocab(self, target_ids) -> None:
        """Draft only these target ids (distinct, ``config.draft_vocab_size`` of them); heads
        with their own LM heads have none (their rows are trained, not the target's)."""
        c = self.config
        if c.own_lm_head:
            raise HeadError("Medusa heads with their own LM heads draft the whole vocabulary")
        try:
            ids, index = vocab_index(target_ids, c.draft_vocab_size, c.vocab_size)
        except ValueError as e:
            raise HeadError(f"a Medusa draft vocabulary {e}, got {np.size(target_ids)}") from None
        self._ids, self._index = ids, mx.array(index)

    @property
    def draft_ids(self) -> np.ndarray | None:
        """The target ids the heads propose (sorted as given), or None: the whole vocabulary."""
        return self._ids

    def to_draft_ids(self, target_ids: mx.array) -> mx.array:
        """Rows of the draft vocabulary for target ids, -1 for ids outside it."""
        return self._index[target_ids]

    def __call__(self, normed_hidden: mx.array, target_head: Callable | None = None) -> mx.array:
        """(N, H) normed last hidden states -> (K, N, V) logits (V: the columns ``target_head``
        gives). ``target_head``: the target's LM head without its final norm
        (``target_lm_head``), needed when the heads share it."""
        if not self.config.own_lm_head and target_head is None:
            raise ValueError("these Medusa heads use the target's LM head: pass target_head")
        return mx.stack([head(normed_hidden, target_head) for head in self.heads])

    def init_from_target(self, target) -> None:
        """Copy the target's LM head into every own LM head (the usual starting point)."""
        if self.config.own_lm_head:
            w = target_lm_head_weight(target)
            for head in self.heads:
                head.lm_head.weight = mx.array(w)


def target_lm_head_weight(target) -> mx.array:
    """The target's LM head as a (V, H) float matrix (the tied embedding when it has none)."""
    layer = target.model.output_head()
    if hasattr(layer, "scales"):  # quantized: one dequantized copy
        return mx.dequantize(layer.weight, layer.scales, layer.biases, layer.group_size, layer.bits)
    return layer.weight


def target_lm_head_rows(target, ids) -> mx.array:
    """One float32 copy of the rows ``ids`` of the target's LM head (len(ids), H), evaluated."""
    rows = target_lm_head_weight(target)[mx.array(np.asarray(ids, dtype=np.int32))]
    rows = rows.astype(mx.float32)
    mx.eval(rows)
    return rows


def target_lm_head(target, ids: np.ndarray | None = None) -> Callable[[mx.array], mx.array]:
    """x (..., H) -> the target's logits (..., V) without its final norm (x is already normed);
    with ``ids``, only those rows' logits (..., len(ids)), from one float copy of the rows."""
    m = target.model
    if ids is not None:
        rows = target_lm_head_rows(target, ids)
        return lambda x: x @ rows.T
    if m.args.tie_word_embeddings:
        return m.model.embed_tokens.as_linear
    return m.lm_head


def medusa_loss(heads: MedusaHeads, batch: dict, target_head: Callable | None = None,
                decay: float = 0.8) -> tuple[mx.array, list[mx.array]]:
    """Sum over heads i of decay**i x the mean cross-entropy of head i, and each head's top-1
    agreement with the target.

    ``batch``: ``hidden`` (B, T, H) the target's normed last hidden states, ``argmax`` (B, T)
    the target's argmax at each position, ``mask`` (B, T) (positions whose predictions train:
    head i's row t counts when t+1+i < T). With a draft vocabulary, ``target_head`` gives the
    logits of its rows (``target_lm_head(target, heads.draft_ids)``); a label outside it is left
    out of the loss and counts as a miss.
    """
    hidden, argmax = batch["hidden"], batch["argmax"]
    B, T, H = hidden.shape
    logits = heads(hidden.reshape(B * T, H), target_head)
    logits = logits.reshape(logits.shape[0], B, T, logits.shape[-1])
    draft = heads.draft_ids is not None
    if draft and logits.shape[-1] != len(heads.draft_ids):
        raise ValueError(f"heads with a draft vocabulary of {len(heads.draft_ids)} need "
                         f"target_lm_head(target, heads.draft_ids); got {logits.shape[-1]} logits")
    rows = batch["mask"].astype(mx.float32)
    loss, top1 = mx.array(0.0), []
    for i in range(logits.shape[0]):
        shift = 1 + i
        if shift >= T:
            top1.append(mx.array(0.0))
            continue
        lg, labels = logits[i][:, : T - shift], argmax[:, shift:]
        valid = rows[:, : T - shift]
        trains, want = valid, labels
        if draft:
            want = heads.to_draft_ids(labels)
            trains = valid * (want >= 0)
            want = mx.maximum(want, 0)
        ce = nn.losses.cross_entropy(lg, want, reduction="none")
        n = mx.maximum(valid.sum(), 1.0)
        loss = loss + decay**i * (ce * trains).sum() / mx.maximum(trains.sum(), 1.0)
        guess = mx.stop_gradient(lg).argmax(axis=-1)
        hit = (guess == want) * (trains > 0) if draft else guess == labels
        top1.append((hit * valid).sum() / n)
    return loss, top1
