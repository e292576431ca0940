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
import os
from dataclasses import dataclass, fields
from functools import lru_cache

import mlx.core as mx
import mlx.nn as nn

from ..cache import KVCache
from ..errors import UnsupportedModelError
from .ops import attend, on_cpu, prepare, silu

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


def _rope(x: mx.array, positions, dims: int, **kw) -> mx.array:
    """RoPE for a chain (int or scalar offset) or a tree (one position per token)."""
    if isinstance(positions, int) or positions.ndim == 0:
        return mx.fast.rope(x, dims, offset=positions, **kw)
    # (1, H, N, D) -> (N, H, 1, D): one rope offset per batch element = per tree node
    y = mx.fast.rope(x.transpose(2, 1, 0, 3), dims, offset=positions, **kw)
    return y.transpose(2, 1, 0, 3)


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
        return _rope(x, positions, self.d, **kw)

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
        self._fused: _FusedBlock | None = None

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
        self._fused = _FusedBlock.build(self)
        return self._fused is not None


# Forwards over at most this many tokens (decode steps, draft trees) run compiled; longer ones
# (prefill chunks, whose lengths vary) run the same functions uncompiled rather than trace anew.
COMPILE_MAX_TOKENS = 64


def _compile_wanted() -> bool:
    # On the CPU backend MLX builds fused kernels with the system C++ compiler (cached under
    # /tmp/mlx); where none is found it evaluates the compiled graph unfused (checked with
    # MLX 0.32.4 and no compiler on PATH), so nothing here depends on one.
    return os.environ.get("EDGESPEC_COMPILE", "1") != "0"


class _FusedBlock:
    """One block's fused weights and the two functions around attention that use them.

    ``pre``: input norm, one q|k|v matmul, split, RoPE. ``post``: o_proj, residual, norm, one
    gate|up matmul, SiLU, down_proj, residual. Attention and the cache write stay outside,
    since their shapes change with the context length every step. The q/k/v and gate/up
    modules keep views into the fused arrays, so there is one copy of every weight, and
    ``current`` notices when something has replaced a module's weight since (the fused copy is
    then stale and the block falls back to the module path).
    """

    def __init__(self, block: Block, weights: dict[str, mx.array], views: list[mx.array]):
        a = block.self_attn
        self.w = weights
        self.views = views
        self.scale = a.scale
        self.key = (a.h, a.kv, a.d, block.input_layernorm.eps, a.traditional, a.base, a.rope_scale,
                    a._freqs is not None, "bqkv" in weights, "bgu" in weights, "bd" in weights,
                    block.mlp.gate_proj.weight.shape[0])
        self.pre_args = [weights[n] for n in ("n1", "wqkv", "bqkv") if n in weights]
        if a._freqs is not None:
            self.pre_args.append(a._freqs)
        self.post_args = [weights[n] for n in ("wo", "n2", "wgu", "wd", "bgu", "bd") if n in weights]

    @classmethod
    def build(cls, block: Block) -> _FusedBlock | None:
        a, m = block.self_attn, block.mlp
        qkv, gu = [a.q_proj, a.k_proj, a.v_proj], [m.gate_proj, m.up_proj]
        if any(type(lin) is not nn.Linear for lin in (*qkv, *gu, a.o_proj, m.down_proj)):
            return None  # quantized (or otherwise custom) layers keep the module path
        if not mx.issubdtype(a.q_proj.weight.dtype, mx.floating):
            return None
        w = {"n1": block.input_layernorm.weight, "n2": block.post_attention_layernorm.weight,
             "wqkv": mx.concatenate([lin.weight for lin in qkv]), "wo": a.o_proj.weight,
             "wgu": mx.concatenate([lin.weight for lin in gu]), "wd": m.down_proj.weight}
        if "bias" in a.q_proj:
            w["bqkv"] = mx.concatenate([lin.bias for lin in qkv])
        if "bias" in m.gate_proj:
            w["bgu"] = mx.concatenate([lin.bias for lin in gu])
        if "bias" in m.down_proj:
            w["bd"] = m.down_proj.bias
        mx.eval(w)
        views = []
        for fused, mods in ((w["wqkv"], qkv), (w["wgu"], gu)):
            start = 0
            for lin in mods:
                n = lin.weight.shape[0]
                lin.weight = fused[start : start + n]
                start += n
                views.append(lin.weight)
        mx.eval(views)
        return cls(block, w, views)

    def current(self, block: Block) -> bool:
        a, m = block.self_attn, block.mlp
        mods = (a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj)
        return all(lin.weight is v for lin, v in zip(mods, self.views))

    def __call__(self, block: Block, x, positions, mask, cache: KVCache, layer: int) -> mx.array:
        positions, mask = prepare(positions, mask)
        compiled = x.shape[1] <= COMPILE_MAX_TOKENS and _compile_wanted()
        pre, post = _block_functions(self.key, compiled, on_cpu())
        q, k, v = pre(x, positions, *self.pre_args)
        k, v = cache.write(layer, k, v)
        return post(x, attend(q, k, v, self.scale, mask), *self.post_args)


@lru_cache(maxsize=None)
def _block_functions(key: tuple, compiled: bool, cpu: bool):  # cpu: silu/attention choice
    h, kv, d, eps, traditional, base, rope_scale, has_freqs, bqkv, bgu, bd, inter = key
    nq, nk = h * d, kv * d

    def pre(x, positions, n1, wqkv, *rest):
        rest = list(rest)
        B, N, _ = x.shape
        y = mx.fast.rms_norm(x, n1, eps) @ wqkv.T
        if bqkv:
            y = y + rest.pop(0)
        freqs = rest.pop(0) if has_freqs else None
        q, k, v = mx.split(y, [nq, nq + nk], axis=-1)
        q = q.reshape(B, N, h, d).transpose(0, 2, 1, 3)
        k = k.reshape(B, N, kv, d).transpose(0, 2, 1, 3)
        v = v.reshape(B, N, kv, d).transpose(0, 2, 1, 3)
        kw = dict(traditional=traditional, base=base, scale=rope_scale, freqs=freqs)
        return _rope(q, positions, d, **kw), _rope(k, positions, d, **kw), v

    def post(x, attn, wo, n2, wgu, wd, *rest):
        rest = list(rest)
        B, N, _ = x.shape
        hdn = x + attn.transpose(0, 2, 1, 3).reshape(B, N, -1) @ wo.T
        g = mx.fast.rms_norm(hdn, n2, eps) @ wgu.T
        if bgu:
            g = g + rest.pop(0)
        gate, up = mx.split(g, [inter], axis=-1)
        y = (silu(gate) * up) @ wd.T
        if bd:
            y = y + rest.pop(0)
        return hdn + y

    if compiled:
        return mx.compile(pre), mx.compile(post)
    return pre, post


class LlamaModel(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [Block(args) for _ in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class Model(nn.Module):
    """``__call__(tokens (1, N), positions, mask, cache) -> hidden (1, N, H)`` before the final norm."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = LlamaModel(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(self, tokens, positions, mask, cache: KVCache, layers: range | None = None,
                 hidden: mx.array | None = None):
        """``hidden`` (1, N, H), when given, replaces the embedding as the input of ``layers``."""
        x = self.model.embed_tokens(tokens) if hidden is None else hidden
        positions, mask = prepare(positions, mask)
        for i in layers if layers is not None else range(len(self.model.layers)):
            x = self.model.layers[i](x, positions, mask, cache, i)
        return x

    def fuse(self) -> int:
        """Fuse every float block (see ``Block.fuse``); returns how many now run fused."""
        return sum(layer.fuse() for layer in self.model.layers)

    def logits(self, hidden: mx.array) -> mx.array:
        h = self.model.norm(hidden)
        if self.args.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(h)
        return self.lm_head(h)
