"""Gemma 3 text (``gemma3_text``; the 270M and 1B checkpoints, and the text of larger ones).

What differs from llama: sliding-window layers interleaved with global ones (``layer_types``, or
every ``sliding_window_pattern``-th layer global), each with its own cache policy
(``cache_windows``) and RoPE base (``rope_local_base_freq`` on sliding layers; ``rope_theta``
and ``rope_scaling`` on global ones); RMSNorms scaled by ``1 + weight``, also over each head of
q and k; norms after attention and around the MLP (``parts.SandwichBlock``); a tanh-GELU gated
MLP; the embedding scaled by sqrt(hidden_size) rounded to bfloat16 (as the checkpoints were
trained); attention scaled by ``query_pre_attn_scalar ** -0.5``. Fused, the blocks run their
small float32 forwards as the native sandwich block (``parts.SandwichBlock``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import mlx.core as mx
import mlx.nn as nn

from ..kernels.qmatmul import embedding_rows
from .decoder import Decoder, DecoderArgs
from .gemma2 import sliding_windows
from .parts import Attention, GatedMLP, OffsetRMSNorm, Rope, SandwichBlock

FAMILY = ("gemma3_text",)


@dataclass
class ModelArgs(DecoderArgs):
    LAYER_TYPES = ("sliding_attention", "full_attention")
    PERIODS = ("sliding_window_pattern",)
    head_dim: int | None = 256
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32768
    rope_local_base_freq: float = 10_000.0
    query_pre_attn_scalar: float = 256.0
    sliding_window: int = 512
    sliding_window_pattern: int = 6
    layer_types: list[str] | None = None

    @classmethod
    def from_dict(cls, config: dict) -> ModelArgs:
        if "sliding_window_pattern" not in config and "_sliding_window_pattern" in config:
            config = {**config, "sliding_window_pattern": config["_sliding_window_pattern"]}
        return super().from_dict(config)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layer_types is None:
            self.layer_types = pattern_types(self.num_hidden_layers, self.sliding_window_pattern)

    def sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == "sliding_attention"


def pattern_types(n: int, p: int) -> list[str]:
    """``layer_types`` of ``n`` layers from ``sliding_window_pattern`` ``p``: every p-th layer
    global, the others sliding."""
    return ["full_attention" if (i + 1) % p == 0 else "sliding_attention" for i in range(n)]


def _block(a: ModelArgs, sliding: bool) -> SandwichBlock:
    norm = partial(OffsetRMSNorm, eps=a.rms_norm_eps)
    rope = (Rope.from_config(a.head_dim, a.rope_local_base_freq, None) if sliding
            else Rope.from_config(a.head_dim, a.rope_theta, a.rope_scaling))
    attn = Attention(a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim,
                     rope, a.query_pre_attn_scalar**-0.5, qk_norm=norm)
    return SandwichBlock(attn, GatedMLP(a.hidden_size, a.intermediate_size, nn.gelu_approx),
                         a.hidden_size, norm)


class Model(Decoder):
    def __init__(self, args: ModelArgs):
        blocks = [_block(args, args.sliding(i)) for i in range(args.num_hidden_layers)]
        super().__init__(args, blocks, OffsetRMSNorm(args.hidden_size, args.rms_norm_eps))
        self.embed_scale = mx.array(math.sqrt(args.hidden_size), dtype=mx.bfloat16).item()

    def embed(self, tokens: mx.array) -> mx.array:
        return embedding_rows(self.model.embed_tokens, tokens) * self.embed_scale

    def cache_windows(self) -> list[int | None]:
        return sliding_windows(self.args)
