"""Llama-family decoder (llama, mistral, qwen2, SmolLM) that can score a draft tree.

Differences from a plain decoder, all driven by arguments rather than state on the module:
- ``positions`` is either an int (consecutive positions from there: a chain) or an array with
  one position per token (a tree: offset + depth), applied through ``mx.fast.rope`` by moving
  the tokens onto the batch axis, where rope accepts one offset per element;
- ``mask`` is the ancestors-only boolean mask from ``tree.attention_mask`` (or None);
- the cache is passed in and only written to (``KVCache.write``); committing is the caller's job.
Weight names follow the Hugging Face layout, so mlx-lm and HF model directories load as they are.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, fields

import mlx.core as mx
import mlx.nn as nn

from ..cache import KVCache
from ..errors import UnsupportedModelError
from ..kernels.activations import silu
from ..kernels.attention import attend, prepare
from ..kernels.fused_block import FusedBlock, rope

FAMILY = ("llama", "mistral", "qwen2")


@dataclass
class ModelArgs:
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_traditional: bool = False
    rope_scaling: dict | None = None
    head_dim: int | None = None
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    use_sliding_window: bool = True
    max_position_embeddings: int = 2048
    model_type: str = "llama"

    @classmethod
    def from_dict(cls, config: dict) -> ModelArgs:
        known = {f.name for f in fields(cls)}
        args = cls(**{k: v for k, v in config.items() if k in known})
        if args.model_type == "qwen2" and "attention_bias" not in config:
            args.attention_bias = True  # qwen2 has q/k/v biases without saying so
        if args.model_type == "qwen2" and not config.get("use_sliding_window", False):
            args.sliding_window = None
        return args

    def __post_init__(self) -> None:
        if self.model_type not in FAMILY:
            raise UnsupportedModelError(
                f"model_type {self.model_type!r} is not supported; supported: {', '.join(FAMILY)}")
        self.num_key_value_heads = self.num_key_value_heads or self.num_attention_heads
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads


def rope_frequencies(args: ModelArgs) -> tuple[float | None, float, mx.array | None]:
    """(base, scale, freqs) for mx.fast.rope from the config's rope_scaling."""
    scaling = args.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return args.rope_theta, 1.0, None
    if kind == "linear":
        return args.rope_theta, 1.0 / float(scaling["factor"]), None
    if kind == "llama3":
        return None, 1.0, _llama3_freqs(args, scaling)
    raise UnsupportedModelError(f"rope_scaling type {kind!r} is not supported; supported: linear, llama3")


def _llama3_freqs(args: ModelArgs, s: dict) -> mx.array:
    dims = args.head_dim
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_ctx = s.get("original_max_position_embeddings", 8192)
    freqs = args.rope_theta ** (mx.arange(0, dims, 2) / dims)  # wavelength / (2 pi)
    wavelen = 2 * math.pi * freqs
    smooth = (old_ctx / wavelen - low) / (high - low)
    mid = freqs / ((1 - smooth) / factor + smooth)
    freqs = mx.where(wavelen > old_ctx / low, freqs * factor, freqs)
    in_mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
    return mx.where(in_mid, mid, freqs)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        h, kv, d = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        self.h, self.kv, self.d = h, kv, d
        self.scale = d**-0.5
        bias = args.attention_bias
        self.q_proj = nn.Linear(args.hidden_size, h * d, bias=bias)
        self.k_proj = nn.Linear(args.hidden_size, kv * d, bias=bias)
        self.v_proj = nn.Linear(args.hidden_size, kv * d, bias=bias)
        self.o_proj = nn.Linear(h * d, args.hidden_size, bias=False)
        self.traditional = args.rope_traditional
        self.base, self.rope_scale, self._freqs = rope_frequencies(args)

    def rope(self, x: mx.array, positions) -> mx.array:
        kw = dict(traditional=self.traditional, base=self.base, scale=self.rope_scale, freqs=self._freqs)
        return rope(x, positions, self.d, **kw)

    def __call__(self, x, positions, mask, cache: KVCache, layer: int) -> mx.array:
        B, N, _ = x.shape
        q = self.q_proj(x).reshape(B, N, self.h, self.d).transpose(0, 2, 1, 3)
        k = self.k_proj(x).reshape(B, N, self.kv, self.d).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, N, self.kv, self.d).transpose(0, 2, 1, 3)
        q, k = self.rope(q, positions), self.rope(k, positions)
        k, v = cache.write(layer, k, v)
        out = attend(q, k, v, self.scale, mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, N, -1))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        dim, hidden, bias = args.hidden_size, args.intermediate_size, args.mlp_bias
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self._fused: FusedBlock | None = None

    def __call__(self, x, positions, mask, cache, layer):
        if self._fused is not None and self._fused.current(self):
            return self._fused(self, x, positions, mask, cache, layer)
        h = x + self.self_attn(self.input_layernorm(x), positions, mask, cache, layer)
        return h + self.mlp(self.post_attention_layernorm(h))

    def fuse(self) -> bool:
        """Concatenate q/k/v and gate/up into one weight each (the modules keep views of it).

        Float layers only; returns whether the block now runs fused. Outputs are unchanged
        (each output element is the same dot product); what changes is 4 matmuls per block
        instead of 7 and, on small inputs, one compiled function on each side of attention.
        """
        self._fused = FusedBlock.build(self)
        return self._fused is not None


class LlamaModel(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [Block(args) for _ in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class Model(nn.Module):
    """The decoder: ``__call__`` runs (some of) its layers writing the cache's scratch slots;
    ``logits`` applies the final norm and the LM head. ``Target.score`` is the one caller."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = LlamaModel(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(self, tokens, positions, mask, cache: KVCache, layers: Sequence[int] | None = None,
                 hidden: mx.array | None = None, capture: Collection[int] = ()
                 ) -> tuple[mx.array, dict[int, mx.array]]:
        """Run ``layers`` (increasing ids; default all) over ``tokens`` (1, N), or over ``hidden``
        (1, N, H) in place of their embedding. Returns the last layer's output (1, N, H) and, for
        each id in ``capture``, the hidden state entering that layer (id L: the last output).

        Cache slot of layer ``i``: ``i`` when the cache has a slot per layer of the model,
        otherwise the position of ``i`` in ``layers`` (a cache made for that subset).
        """
        x = self.model.embed_tokens(tokens) if hidden is None else hidden
        positions, mask = prepare(positions, mask)
        blocks = self.model.layers
        layers = range(len(blocks)) if layers is None else layers
        own_slots = cache.num_layers == len(blocks)
        captured = {}
        for j, i in enumerate(layers):
            if i in capture:
                captured[i] = x
            x = blocks[i](x, positions, mask, cache, i if own_slots else j)
        if len(blocks) in capture:
            captured[len(blocks)] = x
        return x, captured

    def fuse(self) -> int:
        """Fuse every float block (see ``Block.fuse``); returns how many now run fused."""
        return sum(layer.fuse() for layer in self.model.layers)

    def logits(self, hidden: mx.array) -> mx.array:
        h = self.model.norm(hidden)
        if self.args.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(h)
        return self.lm_head(h)
