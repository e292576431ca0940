"""Qwen3-Next: a hybrid of gated DeltaNet linear attention (``recurrent.GatedDeltaNet``, three
layers of every ``full_attention_interval``) and gated full attention (every fourth: q/k
RMSNorms, partial rotary, the output scaled by a sigmoid gate that ``q_proj`` also produces),
with routed experts plus a gated shared expert (``experts.SparseMoE``) or a dense MLP.

Hugging Face checkpoints store per-expert weights and RMSNorm weights as offsets from one
(mlx-community's are converted): ``sanitize`` stacks the former and adds one to the latter, as
mlx-lm does. The recurrent layers keep states (``state_cache.HybridCache``); ``mtp.*`` weights
(the multi-token-prediction layer) are kept, converted like the rest, for
``targets/mtp.py`` (``load_target`` loads the model without them).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import mlx.core as mx
import mlx.nn as nn

from ..kernels.activations import silu
from ..kernels.attention import attend
from .decoder import Decoder, DecoderArgs
from .experts import SparseMoE, routed_layer, stack_experts
from .parts import Attention, GatedMLP, Rope, project
from .recurrent import GatedDeltaNet, MixerBlock

FAMILY = ("qwen3_next",)
_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
          ".q_norm.weight", ".k_norm.weight", "mtp.norm.weight", ".pre_fc_norm_embedding.weight",
          ".pre_fc_norm_hidden.weight")


@dataclass
class ModelArgs(DecoderArgs):
    LAYER_TYPES = ("linear_attention", "full_attention")
    PERIODS = ("full_attention_interval", "decoder_sparse_step")
    linear_num_value_heads: int = 32
    linear_num_key_heads: int = 16
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    full_attention_interval: int = 4
    partial_rotary_factor: float = 0.25
    attention_bias: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    decoder_sparse_step: int = 1
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    mlp_only_layers: list[int] | None = None
    norm_topk_prob: bool = False
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    layer_types: list[str] | None = None

    def linear(self, i: int) -> bool:
        """Whether layer ``i`` is a gated DeltaNet (else full attention): ``layer_types`` where
        the config lists them (Hugging Face's), else every ``full_attention_interval``-th layer
        is attention (mlx-lm's rule; the two agree on the published configs)."""
        if self.layer_types:
            return self.layer_types[i] == "linear_attention"
        return (i + 1) % self.full_attention_interval != 0

    def sparse(self, i: int) -> bool:
        """Whether layer ``i``'s feed-forward is routed experts."""
        return routed_layer(i, self.num_experts, self.decoder_sparse_step, self.mlp_only_layers)


class GatedAttention(Attention):
    """Attention whose ``q_proj`` gives each head's query and an output gate (interleaved per
    head); q/k RMSNorms before RoPE; ``o_proj(out * sigmoid(gate))``."""

    def __init__(self, a: ModelArgs):
        rope = Rope.from_config(int(a.head_dim * a.partial_rotary_factor), a.rope_theta,
                                a.rope_scaling)
        super().__init__(a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim,
                         rope, a.head_dim**-0.5, bias=a.attention_bias,
                         qk_norm=partial(nn.RMSNorm, eps=a.rms_norm_eps))
        self.q_proj = nn.Linear(a.hidden_size, 2 * self.h * self.d, bias=a.attention_bias)
        self.o_proj = nn.Linear(self.h * self.d, a.hidden_size, bias=a.attention_bias)

    def __call__(self, x, positions, mask, cache, layer: int) -> mx.array:
        B, N, _ = x.shape
        q, gate = mx.split(project(self.q_proj, x).reshape(B, N, self.h, 2 * self.d), 2, axis=-1)
        k = project(self.k_proj, x).reshape(B, N, self.kv, self.d)
        v = project(self.v_proj, x).reshape(B, N, self.kv, self.d).transpose(0, 2, 1, 3)
        q = self.rope(self.q_norm(q).transpose(0, 2, 1, 3), positions)
        k = self.rope(self.k_norm(k).transpose(0, 2, 1, 3), positions)
        k, v = cache.write(layer, k, v)
        out = attend(q, k, v, self.scale, mask).transpose(0, 2, 1, 3).reshape(B, N, -1)
        return project(self.o_proj, out * mx.sigmoid(gate.reshape(B, N, -1)))


def block(a: ModelArgs, i: int, fused: bool, experts: bool) -> MixerBlock:
    """Layer ``i``: DeltaNet or gated attention, then experts (where ``experts`` and the config
    say so) or a SiLU MLP. ``fused``: Qwen3-Next's DeltaNet projections (else Qwen3.5's)."""
    if a.linear(i):
        mixer = ("linear_attn", GatedDeltaNet(
            a.hidden_size, a.linear_num_key_heads, a.linear_num_value_heads,
            a.linear_key_head_dim, a.linear_value_head_dim, a.linear_conv_kernel_dim,
            a.rms_norm_eps, fused))
    else:
        mixer = ("self_attn", GatedAttention(a))
    if experts:
        ffn = SparseMoE(a.hidden_size, a.moe_intermediate_size, a.num_experts,
                        a.num_experts_per_tok, norm_topk_prob=a.norm_topk_prob,
                        shared_hidden=a.shared_expert_intermediate_size or None)
    else:
        ffn = GatedMLP(a.hidden_size, a.intermediate_size, silu)
    return MixerBlock(mixer, ("mlp", ffn), ("input_layernorm", "post_attention_layernorm"),
                      a.hidden_size, a.rms_norm_eps)


class Model(Decoder):
    def __init__(self, args: ModelArgs):
        blocks = [block(args, i, True, args.sparse(i)) for i in range(args.num_hidden_layers)]
        super().__init__(args, blocks, nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps))

    def state_layers(self) -> list[int]:
        return [i for i in range(self.args.num_hidden_layers) if self.args.linear(i)]

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Per-expert weights stacked; a Hugging Face checkpoint's (per-expert weights, or a
        conv weight in (C, 1, K)) norm offsets made weights and conv weights made (C, K, 1)."""
        return from_hugging_face(stack_experts(weights, self.args.num_experts or 1), weights)


def from_hugging_face(weights: dict[str, mx.array], original: dict[str, mx.array]) -> dict:
    """Hugging Face's Qwen3-Next/3.5 layout as mlx-lm's: RMSNorm weights stored as offsets from
    one (not the DeltaNet's gated norm) and conv weights (C, 1, K). Detected as mlx-lm does:
    per-expert weights or a conv weight not yet (C, K, 1). ``mtp.*`` kept, its norms converted
    too (all three of the MTP layer's are offsets in Hugging Face's checkpoints, as vLLM's
    ``GemmaRMSNorm`` and mlx-lm's MTP pull request read them)."""
    hf = any(".experts.0." in k for k in original) or any(
        "conv1d.weight" in k and v.shape[-1] != 1 for k, v in weights.items())
    if not hf:
        return weights
    out = {}
    for k, v in weights.items():
        if "conv1d.weight" in k and v.shape[-1] != 1:
            v = v.moveaxis(2, 1)
        if k.endswith(_NORMS) and v.ndim == 1:
            v = v + 1.0
        out[k] = v
    return out
