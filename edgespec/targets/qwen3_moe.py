"""Qwen3-MoE (``qwen3_moe``: Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B): qwen3's
attention (an RMSNorm over each head of q and k) with routed experts (``experts.SparseMoE``:
softmax over all experts, top-k, ``norm_topk_prob``) in place of the MLP, except on
``mlp_only_layers`` and layers off every ``decoder_sparse_step``-th one, which keep qwen3's
dense (fused when float) block. Checkpoints with per-expert weights (Hugging Face's
``mlp.experts.N.*``) are stacked into mlx-lm's ``mlp.switch_mlp`` layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import mlx.nn as nn

from .decoder import Decoder, DecoderArgs
from .experts import MoEBlock, SparseMoE, routed_layer, stack_experts
from .parts import Attention, Rope, silu_block

FAMILY = ("qwen3_moe",)


@dataclass
class ModelArgs(DecoderArgs):
    PERIODS = ("decoder_sparse_step",)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    tie_word_embeddings: bool = False
    num_experts: int = 128
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    norm_topk_prob: bool = False

    def sparse(self, layer: int) -> bool:
        return routed_layer(layer, self.num_experts, self.decoder_sparse_step, self.mlp_only_layers)


def qk_norm_attention(a: DecoderArgs) -> Attention:
    """qwen3's attention of config ``a`` (q/k RMSNorms, no biases)."""
    return Attention(a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim,
                     Rope.from_config(a.head_dim, a.rope_theta, a.rope_scaling), a.head_dim**-0.5,
                     qk_norm=partial(nn.RMSNorm, eps=a.rms_norm_eps))


def _block(a: ModelArgs, layer: int) -> nn.Module:
    if not a.sparse(layer):
        return silu_block(a, qk_norm=True)
    moe = SparseMoE(a.hidden_size, a.moe_intermediate_size, a.num_experts, a.num_experts_per_tok,
                    norm_topk_prob=a.norm_topk_prob)
    return MoEBlock(qk_norm_attention(a), moe, a.hidden_size, a.rms_norm_eps)


class Model(Decoder):
    def __init__(self, args: ModelArgs):
        blocks = [_block(args, i) for i in range(args.num_hidden_layers)]
        super().__init__(args, blocks, nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps))

    def sanitize(self, weights):
        return stack_experts(weights, self.args.num_experts)
