"""Mixtral (``mixtral``: Mixtral 8x7B, 8x22B): llama's attention with routed experts under
``block_sparse_moe`` (``experts.SparseMoE``: top-k router logits, softmax over those k).
Hugging Face's per-expert ``w1``/``w3``/``w2`` are stacked into mlx-lm's ``switch_mlp``
``gate_proj``/``up_proj``/``down_proj``.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.nn as nn

from .decoder import Decoder, DecoderArgs
from .experts import MoEBlock, SparseMoE, stack_experts
from .parts import Attention, Rope

FAMILY = ("mixtral",)
_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


@dataclass
class ModelArgs(DecoderArgs):
    rope_theta: float = 1_000_000.0
    rope_traditional: bool = False
    tie_word_embeddings: bool = False
    num_local_experts: int = 8
    num_experts_per_tok: int = 2
    sliding_window: int | None = None


def _block(a: ModelArgs) -> MoEBlock:
    rope = Rope.from_config(a.head_dim, a.rope_theta, a.rope_scaling, a.rope_traditional)
    attn = Attention(a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim, rope,
                     a.head_dim**-0.5)
    moe = SparseMoE(a.hidden_size, a.intermediate_size, a.num_local_experts, a.num_experts_per_tok,
                    scoring="topk_softmax")
    return MoEBlock(attn, moe, a.hidden_size, a.rms_norm_eps, ffn="block_sparse_moe")


class Model(Decoder):
    def __init__(self, args: ModelArgs):
        blocks = [_block(args) for _ in range(args.num_hidden_layers)]
        super().__init__(args, blocks, nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps))

    def sanitize(self, weights):
        return stack_experts(weights, self.args.num_local_experts, names=_NAMES)

    def cache_windows(self) -> list[int | None]:
        """Mixtral's ``sliding_window`` (null in the released configs) on every layer."""
        return [self.args.sliding_window] * self.args.num_hidden_layers
