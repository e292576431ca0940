"""Phi-3 / Phi-3.5 / Phi-4-mini (``phi3``): llama's pre-norm SiLU blocks with q|k|v and gate|up
stored fused (``qkv_proj``, ``gate_up_proj``; ``sanitize`` splits them into llama's modules, so
float blocks then run ``kernels/fused_block`` like llama's), RoPE over ``partial_rotary_factor``
of each head, and su/longrope scaling.

su/longrope as mlx-lm's ``SuScaledRoPE`` (the oracle): frequencies divided by ``long_factor``
at every length, and the rotated features scaled by sqrt(1 + ln(s) / ln(original context)) with
s = max_position_embeddings / original_max_position_embeddings (1 when s <= 1). (Hugging Face
switches to ``short_factor`` below the original context; mlx-lm and llama.cpp at a long context
do not.) The config's ``sliding_window`` is ignored, as mlx-lm does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ..errors import UnsupportedModelError
from .decoder import Decoder, DecoderArgs
from .parts import Rope, silu_block

FAMILY = ("phi3",)


@dataclass
class ModelArgs(DecoderArgs):
    partial_rotary_factor: float = 1.0
    max_position_embeddings: int = 131072
    original_max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False

    def rope(self) -> Rope:
        dims = int(self.head_dim * self.partial_rotary_factor)
        s = self.rope_scaling or {}
        kind = s.get("type", s.get("rope_type"))
        if kind not in ("su", "longrope"):
            return Rope.from_config(dims, self.rope_theta, self.rope_scaling)
        if "long_factor" not in s or len(s["long_factor"]) != dims // 2:
            raise UnsupportedModelError(
                f"{kind} rope_scaling needs a long_factor of {dims // 2} values (one per rotated "
                f"pair), got {s.get('long_factor')!r}")
        freqs = mx.array(s["long_factor"], dtype=mx.float32) * (
            self.rope_theta ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims))
        orig = self.original_max_position_embeddings
        factor = self.max_position_embeddings / orig
        mscale = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        return Rope(dims, None, freqs=freqs, mscale=mscale)


class Model(Decoder):
    def __init__(self, args: ModelArgs):
        rope = args.rope()
        blocks = [silu_block(args, rope=rope) for _ in range(args.num_hidden_layers)]
        super().__init__(args, blocks, nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps))

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Split ``qkv_proj`` into q/k/v_proj and ``gate_up_proj`` into gate/up_proj (weights,
        and the scales and biases of quantized ones: all are split along the output rows)."""
        a = self.args
        q, kv = a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
        out = {}
        for name, w in weights.items():
            module, _, part = name.rpartition(".")
            if module.endswith("self_attn.qkv_proj"):
                stem = module[: -len("qkv_proj")]
                for proj, piece in zip(("q", "k", "v"), mx.split(w, [q, q + kv])):
                    out[f"{stem}{proj}_proj.{part}"] = piece
            elif module.endswith("mlp.gate_up_proj"):
                stem = module[: -len("gate_up_proj")]
                gate, up = mx.split(w, 2)
                out[f"{stem}gate_proj.{part}"], out[f"{stem}up_proj.{part}"] = gate, up
            else:
                out[name] = w
        return out
