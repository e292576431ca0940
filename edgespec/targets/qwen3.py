"""Qwen3 (dense): llama's pre-norm SiLU blocks with an RMSNorm over each head of q and k before
RoPE, no biases, an explicit ``head_dim``. Float blocks run fused (the fused functions apply
the q/k norms too), and on the CPU as the native block (``native/block.h``: the q/k norm
weights after the products'), so a forward is one native operation, as llama's.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.nn as nn

from .decoder import Decoder, DecoderArgs
from .parts import silu_block

FAMILY = ("qwen3",)


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960


class Model(Decoder):
    def __init__(self, args: ModelArgs):
        blocks = [silu_block(args, qk_norm=True) for _ in range(args.num_hidden_layers)]
        super().__init__(args, blocks, nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps))
