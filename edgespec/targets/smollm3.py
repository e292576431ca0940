"""SmolLM3 (``smollm3``): llama blocks, except that some layers apply no RoPE at all (NoPE).

``no_rope_layers[i]`` is 1 where layer i rotates q and k and 0 where it does not; without it,
every ``no_rope_layer_interval``-th layer (the 4th, 8th, ...) is a NoPE layer, as in mlx-lm and
Hugging Face. Float blocks run fused (``kernels/fused_block`` skips the rotation on NoPE layers).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.nn as nn

from ..errors import ModelLoadError
from . import llama
from .decoder import Decoder
from .parts import Rope, silu_block

FAMILY = ("smollm3",)


@dataclass
class ModelArgs(llama.ModelArgs):
    PERIODS = ("no_rope_layer_interval",)
    no_rope_layer_interval: int = 4
    no_rope_layers: list[int] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.num_hidden_layers
        if self.no_rope_layers is None:
            self.no_rope_layers = [int((i + 1) % self.no_rope_layer_interval != 0) for i in range(n)]
        elif len(self.no_rope_layers) < n:
            raise ModelLoadError(f"no_rope_layers has {len(self.no_rope_layers)} entries for "
                                 f"{n} layers; expected one 0/1 per layer")


class Model(llama.Model):  # llama's cache policy (layer_types / sliding_window)
    def __init__(self, args: ModelArgs):
        blocks = [silu_block(args, bias=args.attention_bias, mlp_bias=args.mlp_bias,
                             traditional=args.rope_traditional,
                             rope=None if args.no_rope_layers[i] else Rope.none())
                  for i in range(args.num_hidden_layers)]
        Decoder.__init__(self, args, blocks, nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps))
