"""gpt-oss (``gpt_oss``: gpt-oss-20b, gpt-oss-120b): attention with q/k/v/o biases and a learned
sink logit per head (``parts.Attention(sinks=True)``; the tree attention kernels take no sinks,
so these layers attend on the written-out path), sliding-window layers alternating with full
ones (``layer_types``, window ``sliding_window``), YaRN RoPE, and routed experts with biases
(``mlp.router``: top-k logits, softmax over those k; ``mlp.experts``: the clamped SwiGLU
``experts.swiglu_oai`` with ``swiglu_limit``).

Weights: mlx-community's (``mlp.experts.gate_proj``/``up_proj``/``down_proj``) as they are;
OpenAI's (``gate_up_proj`` with gate and up rows interleaved, ``*_bias``, MXFP4
``*_blocks``/``*_scales``) split as mlx-lm's ``sanitize`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import mlx.core as mx
import mlx.nn as nn

from .decoder import Decoder, DecoderArgs
from .experts import MoEBlock, SparseMoE, swiglu_oai
from .parts import Attention, Rope

FAMILY = ("gpt_oss",)


@dataclass
class ModelArgs(DecoderArgs):
    LAYER_TYPES = ("sliding_attention", "full_attention")
    head_dim: int | None = 64
    rope_theta: float = 150000.0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 131072
    num_local_experts: int = 32
    num_experts_per_tok: int = 4
    sliding_window: int = 128
    layer_types: list[str] | None = None
    swiglu_limit: float = 7.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layer_types is None:  # HF's default: sliding first, then every other layer
            self.layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention"
                                for i in range(self.num_hidden_layers)]


def _block(a: ModelArgs) -> MoEBlock:
    rope = Rope.from_config(a.head_dim, a.rope_theta, a.rope_scaling)
    attn = Attention(a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim, rope,
                     a.head_dim**-0.5, bias=True, o_bias=True, sinks=True)
    moe = SparseMoE(a.hidden_size, a.intermediate_size, a.num_local_experts, a.num_experts_per_tok,
                    scoring="topk_softmax", glu=partial(swiglu_oai, limit=a.swiglu_limit),
                    bias=True, router_bias=True, router="router", experts="experts")
    return MoEBlock(attn, moe, a.hidden_size, a.rms_norm_eps)


class Model(Decoder):
    def __init__(self, args: ModelArgs):
        blocks = [_block(args) for _ in range(args.num_hidden_layers)]
        super().__init__(args, blocks, nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps))

    def cache_windows(self) -> list[int | None]:
        a = self.args
        return [a.sliding_window if t == "sliding_attention" else None for t in a.layer_types]

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        if any(k.endswith("experts.gate_proj.weight") for k in weights):
            return weights  # mlx-lm's layout already
        out = {}
        for k, v in weights.items():
            if "gate_up_proj" in k or "down_proj_" in k or k.endswith("experts.down_proj"):
                out.update(_split_expert_weight(k, v))
            else:
                out[k] = v
        return out


def _split_expert_weight(key: str, v: mx.array) -> dict[str, mx.array]:
    """One of OpenAI's fused expert tensors as mlx-lm's: gate_up_proj rows (and its bias's
    entries) alternate gate, up; MXFP4 ``_blocks`` become uint32 words, ``_scales`` scales."""
    base, _, kind = key.partition(".experts.")
    name = kind.split("_proj")[0] + "_proj"  # gate_up_proj or down_proj
    suffix = kind[len(name):] or "weight"
    if suffix == "_blocks":
        v = v.view(mx.uint32).flatten(-2)
    part = {"weight": "weight", "_blocks": "weight", "_scales": "scales", "_bias": "bias"}[suffix]
    prefix = f"{base}.experts."
    if name == "down_proj":
        return {f"{prefix}down_proj.{part}": v}
    gate, up = (v[..., ::2], v[..., 1::2]) if part == "bias" else (v[..., ::2, :], v[..., 1::2, :])
    return {f"{prefix}gate_proj.{part}": mx.contiguous(gate),
            f"{prefix}up_proj.{part}": mx.contiguous(up)}
