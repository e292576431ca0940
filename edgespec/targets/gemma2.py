"""Gemma 2 (``gemma2``: the 2B, 9B and 27B checkpoints).

Gemma 3's layout (``parts.SandwichBlock``: (1 + w) RMSNorms before and after attention and the
tanh-GELU MLP, the embedding scaled by sqrt(hidden_size), attention scaled by
``query_pre_attn_scalar ** -0.5``) without q/k norms and with one RoPE base, plus soft-capping:
attention scores become ``c * tanh(s / c)`` with ``c = attn_logit_softcapping`` before the mask,
and the final logits the same with ``final_logit_softcapping``. Sliding-window layers alternate
with global ones, starting with a sliding one (``layer_types`` when the config has them).

mlx-lm's gemma2 (the oracle in ``tests/test_families.py``) attends globally on every layer and
scales the embedding by the unrounded sqrt(hidden_size); the windows here follow Hugging Face's
Gemma 2 (they only matter past ``sliding_window`` tokens, 4096 in the released checkpoints), the
embedding scale follows mlx-lm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import mlx.core as mx
import mlx.nn as nn

from ..kernels.qmatmul import embedding_rows
from .decoder import Decoder, DecoderArgs
from .parts import Attention, GatedMLP, OffsetRMSNorm, Rope, SandwichBlock

FAMILY = ("gemma2",)


@dataclass
class ModelArgs(DecoderArgs):
    LAYER_TYPES = ("sliding_attention", "full_attention")
    head_dim: int | None = 256
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 8192
    query_pre_attn_scalar: float = 256.0
    attn_logit_softcapping: float | None = 50.0
    final_logit_softcapping: float | None = 30.0
    sliding_window: int | None = 4096
    layer_types: list[str] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layer_types is None:
            self.layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention"
                                for i in range(self.num_hidden_layers)]

    def sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == "sliding_attention"


def softcap(logits: mx.array, cap: float | None) -> mx.array:
    """Gemma's final logit soft-capping, ``cap * tanh(logits / cap)`` (None: none)."""
    return logits if cap is None else mx.tanh(logits / cap) * cap


def sliding_windows(a) -> list[int | None]:
    """The cache window per layer: ``a.sliding_window`` where ``a.sliding(layer)``, else None."""
    return [a.sliding_window if a.sliding(i) else None for i in range(a.num_hidden_layers)]


def _block(a: ModelArgs) -> SandwichBlock:
    norm = partial(OffsetRMSNorm, eps=a.rms_norm_eps)
    rope = Rope.from_config(a.head_dim, a.rope_theta, a.rope_scaling)
    attn = Attention(a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim,
                     rope, a.query_pre_attn_scalar**-0.5, softcap=a.attn_logit_softcapping)
    return SandwichBlock(attn, GatedMLP(a.hidden_size, a.intermediate_size, nn.gelu_approx),
                         a.hidden_size, norm)


class Model(Decoder):
    def __init__(self, args: ModelArgs):
        blocks = [_block(args) for _ in range(args.num_hidden_layers)]
        super().__init__(args, blocks, OffsetRMSNorm(args.hidden_size, args.rms_norm_eps))
        self.embed_scale = math.sqrt(args.hidden_size)

    def embed(self, tokens: mx.array) -> mx.array:
        return embedding_rows(self.model.embed_tokens, tokens) * self.embed_scale

    def logits(self, hidden: mx.array) -> mx.array:
        return softcap(super().logits(hidden), self.args.final_logit_softcapping)

    def cache_windows(self) -> list[int | None]:
        return sliding_windows(self.args)
