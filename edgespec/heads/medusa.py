"""Medusa-1 heads: K heads over the target's normed last hidden state, head i predicting the token
at t+2+i.

Head i = ``num_layers`` residual blocks ``x + SiLU(linear(x))`` (H -> H, with bias; weight and bias
zero-initialised, so a new head starts as the identity), then an LM head: its own Linear(H, V) (initialised from the
target's) or the target's own head, frozen (``own_lm_head=False``: K x H x V fewer weights, one
shared matrix). Labels: head i at position t learns the target's argmax at position t+1+i.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from ..kernels.activations import silu
from .config import HeadConfig


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

    def __call__(self, normed_hidden: mx.array, target_head: Callable | None = None) -> mx.array:
        """(N, H) normed last hidden states -> (K, N, V) logits. ``target_head``: the target's
        LM head without its final norm (``target_lm_head``), needed when the heads share it."""
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
    m = target.model
    layer = m.model.embed_tokens if m.args.tie_word_embeddings else m.lm_head
    if hasattr(layer, "scales"):  # quantized: one dequantized copy
        return mx.dequantize(layer.weight, layer.scales, layer.biases, layer.group_size, layer.bits)
    return layer.weight


def target_lm_head(target) -> Callable[[mx.array], mx.array]:
    """x (..., H) -> the target's logits (..., V) without its final norm (x is already normed)."""
    m = target.model
    if m.args.tie_word_embeddings:
        return m.model.embed_tokens.as_linear
    return m.lm_head


def medusa_loss(heads: MedusaHeads, batch: dict, target_head: Callable | None = None,
                decay: float = 0.8) -> tuple[mx.array, list[mx.array]]:
    """Sum over heads i of decay**i x the mean cross-entropy of head i, and each head's top-1
    agreement with the target.

    ``batch``: ``hidden`` (B, T, H) the target's normed last hidden states, ``argmax`` (B, T)
    the target's argmax at each position, ``mask`` (B, T) (positions whose predictions train:
    head i's row t counts when t+1+i < T).
    """
    hidden, argmax = batch["hidden"], batch["argmax"]
    B, T, H = hidden.shape
    logits = heads(hidden.reshape(B * T, H), target_head).reshape(-1, B, T, heads.config.vocab_size)
    rows = batch["mask"].astype(mx.float32)
    loss, top1 = mx.array(0.0), []
    for i in range(logits.shape[0]):
        shift = 1 + i
        if shift >= T:
            top1.append(mx.array(0.0))
            continue
        lg, labels = logits[i][:, : T - shift], argmax[:, shift:]
        valid = rows[:, : T - shift]
        ce = nn.losses.cross_entropy(lg, labels, reduction="none")
        n = mx.maximum(valid.sum(), 1.0)
        loss = loss + decay**i * (ce * valid).sum() / n
        top1.append(((mx.stop_gradient(lg).argmax(axis=-1) == labels) * valid).sum() / n)
    return loss, top1
