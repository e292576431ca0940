"""LFM2 (Liquid): gated short-convolution blocks (``recurrent.ShortConv``) beside a few
attention blocks (q/k RMSNorms, full rotary), each followed by a SwiGLU feed-forward; the final
norm is ``embedding_norm``, the head tied to the embedding.

Checkpoint names are mapped onto the shared parts in ``sanitize``: the attention's
``q_layernorm``/``k_layernorm``/``out_proj`` become ``q_norm``/``k_norm``/``o_proj``, the final
``embedding_norm`` is the decoder's ``norm``, and Hugging Face's conv weights (C, 1, K) become
mlx's (C, K, 1). The convolution layers keep their window of inputs as a state
(``state_cache.HybridCache``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import mlx.core as mx
import mlx.nn as nn

from ..kernels.activations import silu
from .decoder import Decoder, DecoderArgs
from .parts import Attention, Rope, project
from .recurrent import MixerBlock, ShortConv

FAMILY = ("lfm2",)


@dataclass
class ModelArgs(DecoderArgs):
    LAYER_TYPES = ("conv", "full_attention")
    norm_eps: float = 1e-5
    conv_bias: bool = False
    conv_L_cache: int = 3
    block_dim: int | None = None
    block_ff_dim: int | None = None
    block_multiple_of: int = 256
    block_ffn_dim_multiplier: float | None = None
    block_auto_adjust_ff_dim: bool = True
    rope_theta: float = 1_000_000.0
    rope_parameters: dict | None = None
    full_attn_idxs: list[int] | None = None
    layer_types: list[str] | None = None
    max_position_embeddings: int = 128000

    @classmethod
    def from_dict(cls, config: dict) -> ModelArgs:
        """``intermediate_size`` from ``block_ff_dim`` where only that is given."""
        ff = config.get("block_ff_dim") or config.get("intermediate_size")
        return super().from_dict({**config, "intermediate_size": ff})

    def __post_init__(self) -> None:
        super().__post_init__()
        self.tie_word_embeddings = True
        self.rms_norm_eps = self.norm_eps
        self.head_dim = self.hidden_size // self.num_attention_heads
        if self.rope_parameters and "rope_theta" in self.rope_parameters:
            self.rope_theta = self.rope_parameters["rope_theta"]
        if self.full_attn_idxs is None:
            self.full_attn_idxs = [i for i, t in enumerate(self.layer_types or ())
                                   if t == "full_attention"]

    def ff_dim(self) -> int:
        """The feed-forward width (``block_auto_adjust_ff_dim``: 2/3 of it, times the
        multiplier, rounded up to ``block_multiple_of``)."""
        ff = self.intermediate_size
        if self.block_auto_adjust_ff_dim:
            ff = int(2 * ff / 3)
            if self.block_ffn_dim_multiplier is not None:
                ff = int(self.block_ffn_dim_multiplier * ff)
            m = self.block_multiple_of
            ff = m * ((ff + m - 1) // m)
        return ff


class FeedForward(nn.Module):
    """w2(silu(w1(x)) * w3(x))."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return project(self.w2, silu(project(self.w1, x)) * project(self.w3, x))


class Model(Decoder):
    def __init__(self, args: ModelArgs):
        a = args
        blocks = []
        for i in range(a.num_hidden_layers):
            if i in a.full_attn_idxs:
                mixer = ("self_attn", Attention(
                    a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim,
                    Rope.from_config(a.head_dim, a.rope_theta, None), a.head_dim**-0.5,
                    qk_norm=partial(nn.RMSNorm, eps=a.norm_eps)))
            else:
                mixer = ("conv", ShortConv(a.hidden_size, a.conv_L_cache, a.conv_bias))
            ffn = ("feed_forward", FeedForward(a.hidden_size, a.ff_dim()))
            blocks.append(MixerBlock(mixer, ffn, ("operator_norm", "ffn_norm"), a.hidden_size,
                                     a.norm_eps))
        super().__init__(args, blocks, nn.RMSNorm(a.hidden_size, eps=a.norm_eps))

    def state_layers(self) -> list[int]:
        return [i for i in range(self.args.num_hidden_layers) if i not in self.args.full_attn_idxs]

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        renames = ((".self_attn.q_layernorm.", ".self_attn.q_norm."),
                   (".self_attn.k_layernorm.", ".self_attn.k_norm."),
                   (".self_attn.out_proj.", ".self_attn.o_proj."),
                   ("model.embedding_norm.", "model.norm."))
        out = {}
        for k, v in weights.items():
            for old, new in renames:
                k = k.replace(old, new)
            if "conv.weight" in k and v.ndim == 3 and v.shape[-1] > v.shape[1]:
                v = v.transpose(0, 2, 1)
            out[k] = v
        return out
