"""The llama family: llama (1-3.x, with llama3 rope scaling), mistral (a sliding window on every
layer), ministral-style ``layer_types`` (sliding and full layers interleaved), qwen2 (q/k/v
biases), SmolLM2. Pre-norm SiLU blocks (``parts.PreNormBlock``); float blocks run fused.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.nn as nn

from .decoder import Decoder, DecoderArgs
from .parts import silu_block

FAMILY = ("llama", "mistral", "qwen2")


@dataclass
class ModelArgs(DecoderArgs):
    LAYER_TYPES = ("sliding_attention", "full_attention")
    rope_traditional: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    layer_types: list[str] | None = None

    @classmethod
    def from_dict(cls, config: dict) -> ModelArgs:
        args = super().from_dict(config)
        if args.model_type == "qwen2" and "attention_bias" not in config:
            args.attention_bias = True  # qwen2 has q/k/v biases without saying so
        if args.model_type == "qwen2" and not config.get("use_sliding_window", False):
            args.sliding_window = None
        return args


class Model(Decoder):
    def __init__(self, args: ModelArgs):
        blocks = [silu_block(args, bias=args.attention_bias, mlp_bias=args.mlp_bias,
                             traditional=args.rope_traditional)
                  for _ in range(args.num_hidden_layers)]
        super().__init__(args, blocks, nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps))

    def cache_windows(self) -> list[int | None]:
        """``layer_types`` when the config has them, else mistral's one window for every layer."""
        a = self.args
        if a.layer_types is None:
            return [a.sliding_window] * a.num_hidden_layers
        return [a.sliding_window if t == "sliding_attention" else None for t in a.layer_types]
