"""Building blocks the family files in ``targets/`` share: RoPE settings, RMSNorm with an offset
weight, attention over the cache (with optional per-head q/k norms and logit soft-capping), the
gated MLP, the pre-norm block (llama, qwen3, phi3, smollm3) with its fused fast path, and Gemma's
sandwich block (norms before and after attention and MLP).

Every piece takes what differs between families as constructor arguments (the activation, the
norm class, the rope settings, the attention scale), so a family file only says how its config
maps onto them. Weight names are Hugging Face's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import mlx.core as mx
import mlx.nn as nn

from ..cache import KVCache
from ..errors import UnsupportedModelError
from ..kernels.activations import silu
from ..kernels.attention import attend
from ..kernels.fused_block import FusedBlock
from ..kernels.rope_norm import rope
from ..kernels.matmul import linear


@dataclass(frozen=True)
class Rope:
    """RoPE over the first ``dims`` features of each head, for a chain or a tree (see ``rope``).

    ``dims == 0``: no rotation at all (SmolLM3's NoPE layers). ``mscale`` multiplies the rotated
    features first (phi3's su/longrope attention factor, applied to q and k alike).
    """

    dims: int
    base: float | None
    scale: float = 1.0
    freqs: mx.array | None = None
    traditional: bool = False
    mscale: float = 1.0

    @classmethod
    def none(cls) -> Rope:
        return cls(0, None)

    @classmethod
    def from_config(cls, dims: int, theta: float, scaling: dict | None,
                    traditional: bool = False) -> Rope:
        """Settings for a config's ``rope_theta`` and ``rope_scaling`` (default, linear, llama3)."""
        scaling = scaling or {}
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind in (None, "default"):
            return cls(dims, theta, traditional=traditional)
        if kind == "linear":
            return cls(dims, theta, 1.0 / float(scaling["factor"]), traditional=traditional)
        if kind == "llama3":
            return cls(dims, None, freqs=_llama3_freqs(dims, theta, scaling), traditional=traditional)
        if kind == "yarn":
            freqs, mscale = _yarn(dims, theta, scaling)
            return cls(dims, None, freqs=freqs, traditional=traditional, mscale=mscale)
        raise UnsupportedModelError(
            f"rope_scaling type {kind!r} is not supported; supported: default, linear, llama3, yarn")

    def __call__(self, x: mx.array, positions) -> mx.array:
        return rope(x, positions, self.dims, self.mscale, traditional=self.traditional,
                    base=self.base, scale=self.scale, freqs=self.freqs)


def _llama3_freqs(dims: int, theta: float, s: dict) -> mx.array:
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_ctx = s.get("original_max_position_embeddings", 8192)
    freqs = theta ** (mx.arange(0, dims, 2) / dims)  # wavelength / (2 pi)
    wavelen = 2 * math.pi * freqs
    smooth = (old_ctx / wavelen - low) / (high - low)
    mid = freqs / ((1 - smooth) / factor + smooth)
    freqs = mx.where(wavelen > old_ctx / low, freqs * factor, freqs)
    in_mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
    return mx.where(in_mid, mid, freqs)


def _yarn(dims: int, theta: float, s: dict) -> tuple[mx.array, float]:
    """YaRN (gpt-oss): wavelengths between the fast and slow corrections blended from the
    extrapolated to the interpolated ones, and the rotated features scaled by its mscale.
    ``truncate`` (Hugging Face's, default true) rounds the blend's range to whole dimensions."""
    factor = float(s["factor"])
    old_ctx = s.get("original_max_position_embeddings", 4096)

    def dim_of(rotations: float) -> float:
        return dims * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(s.get("beta_fast", 32)), dim_of(s.get("beta_slow", 1))
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    high = high + 0.001 if low == high else high
    ramp = mx.clip((mx.arange(dims // 2, dtype=mx.float32) - low) / (high - low), 0, 1)
    extra = theta ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
    inter = factor * extra
    freqs = inter * extra / (inter * (1 - ramp) + extra * ramp)

    def mscale(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    return freqs, mscale(s.get("mscale", 1)) / mscale(s.get("mscale_all_dim", 0))


class OffsetRMSNorm(nn.Module):
    """RMSNorm scaled by ``1 + weight`` (Gemma stores the weight as an offset from one)."""

    def __init__(self, dims: int, eps: float):
        super().__init__()
        self.weight = mx.zeros((dims,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, 1.0 + self.weight, self.eps)


class Attention(nn.Module):
    """Grouped-query attention writing its keys/values to ``cache`` (slot ``layer``).

    ``qk_norm``: a norm class applied to each head of q and k before RoPE (qwen3, gemma3), or
    None. ``scale`` multiplies q·k (head_dim ** -0.5 unless the family says otherwise);
    ``softcap`` caps the scores to ``softcap * tanh(s / softcap)`` before the mask (gemma2).
    ``o_bias``: o_proj has a bias too; ``sinks``: a learned per-head sink logit in the softmax
    (gpt-oss; ``kernels.attention.attend``).
    """

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, rope: Rope,
                 scale: float, bias: bool = False, qk_norm: Callable[[int], nn.Module] | None = None,
                 softcap: float | None = None, o_bias: bool = False, sinks: bool = False):
        super().__init__()
        self.h, self.kv, self.d = heads, kv_heads, head_dim
        self.scale = scale
        self.softcap = softcap
        self.rope = rope
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=o_bias)
        if sinks:
            self.sinks = mx.zeros((heads,))
        self.q_norm = qk_norm(head_dim) if qk_norm is not None else None
        self.k_norm = qk_norm(head_dim) if qk_norm is not None else None

    def __call__(self, x, positions, mask, cache: KVCache, layer: int) -> mx.array:
        B, N, _ = x.shape
        q = project(self.q_proj, x).reshape(B, N, self.h, self.d)
        k = project(self.k_proj, x).reshape(B, N, self.kv, self.d)
        v = project(self.v_proj, x).reshape(B, N, self.kv, self.d).transpose(0, 2, 1, 3)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = self.rope(q.transpose(0, 2, 1, 3), positions)
        k = self.rope(k.transpose(0, 2, 1, 3), positions)
        k, v = cache.write(layer, k, v)
        out = attend(q, k, v, self.scale, mask, self.softcap,
                     self["sinks"] if "sinks" in self else None)
        return project(self.o_proj, out.transpose(0, 2, 1, 3).reshape(B, N, -1))


def project(module: nn.Module, x: mx.array) -> mx.array:
    """A projection of the module path, through ``kernels.matmul.linear``: the native kernels
    where they apply (4/8-bit weights at any row count, float32 ones up to ``SMALL_M_MAX``
    rows), whose rows do not depend on each other, so that a family without a native block
    (Gemma, the layers of MoE and hybrid models around their experts and recurrences) gives a
    verify's rows the bits one-token decoding gives them; MLX's product (BLAS) elsewhere, whose
    rows may depend on how many come together (``tests/test_families.py``). The kernels have
    pure-MLX twins of their own."""
    return linear(module, x)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); ``act`` is SiLU (llama, qwen) or tanh-GELU (gemma)."""

    def __init__(self, dim: int, hidden: int, act: Callable[[mx.array], mx.array], bias: bool = False):
        super().__init__()
        self.act = act
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)

    def __call__(self, x: mx.array) -> mx.array:
        return project(self.down_proj, self.act(project(self.gate_proj, x)) * project(self.up_proj, x))


class FusedForms:
    """What a block with a fused form (``kernels/fused_block.FusedBlock``, in ``_fused``)
    offers the decoder: fusing, whether it runs natively, several sequences at once, and the
    weights a forward streams (moved by ``targets/weight_arena``)."""

    _fused = None
    sandwich = False  # Gemma's norms around attention and the MLP (``SandwichBlock``)

    def fuse(self) -> bool:
        """Concatenate q/k/v and gate/up into one weight each (the modules keep views of it).

        Returns whether the block now has its fused form (``FusedBlock.build``: float, or
        quantized layers alike where joined; a sandwich block only where the native block
        takes its products). Outputs are unchanged (each output element is the same dot
        product); what changes is 4 matmuls per block instead of 7 and, on small inputs, one
        compiled function on each side of attention (a sandwich block: the native block).
        """
        self._fused = FusedBlock.build(self)
        return self._fused is not None

    def native_ready(self) -> bool:
        """Whether small forwards run as one native operation (``FusedBlock.native_ready``)."""
        return self._fused is not None and self._fused.native_ready()

    def native_many(self, x, masks, caches, layer):
        """Several sequences' rows in one native operation (``FusedBlock.native_many``; only
        where ``native_ready``)."""
        return self._fused.native_many(x, masks, caches, layer)

    def streamed(self) -> list[mx.array]:
        """The fused weights a forward streams, in reading order (none when not fused)."""
        return self._fused.streamed() if self._fused is not None else []

    def place(self, arrays: list[mx.array]) -> None:
        """Run fused on ``arrays``, copies of ``streamed()`` moved elsewhere (the modules'
        weights become views of them too)."""
        assert [(a.shape, a.dtype) for a in arrays] == [(a.shape, a.dtype) for a in self.streamed()]
        self._fused = FusedBlock.build(self, placed=arrays)


class PreNormBlock(FusedForms, nn.Module):
    """x + attn(norm(x)), then h + mlp(norm(h)): llama, mistral, qwen2, qwen3.

    Float blocks can be fused (``fuse``) to run through ``kernels/fused_block.FusedBlock``; the
    module path below is its pure-MLX twin (``tests/test_forward.py``).
    """

    def __init__(self, attn: Attention, mlp: GatedMLP, hidden: int, eps: float):
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.input_layernorm = nn.RMSNorm(hidden, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(hidden, eps=eps)
        self._fused: FusedBlock | None = None

    def __call__(self, x, positions, mask, cache, layer):
        if self._fused is not None and self._fused.current(self):
            return self._fused(self, x, positions, mask, cache, layer)
        h = x + self.self_attn(self.input_layernorm(x), positions, mask, cache, layer)
        return h + self.mlp(self.post_attention_layernorm(h))


def silu_block(a, *, bias: bool = False, mlp_bias: bool = False, traditional: bool = False,
               qk_norm: bool = False, rope: Rope | None = None) -> PreNormBlock:
    """The pre-norm SiLU block of a ``DecoderArgs`` config (llama's, or qwen3's with q/k norms);
    ``rope`` replaces the config's RoPE settings (phi3's longrope, smollm3's NoPE layers)."""
    if rope is None:
        rope = Rope.from_config(a.head_dim, a.rope_theta, a.rope_scaling, traditional)
    norm = partial(nn.RMSNorm, eps=a.rms_norm_eps) if qk_norm else None
    attn = Attention(a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim, rope,
                     a.head_dim**-0.5, bias=bias, qk_norm=norm)
    mlp = GatedMLP(a.hidden_size, a.intermediate_size, silu, bias=mlp_bias)
    return PreNormBlock(attn, mlp, a.hidden_size, a.rms_norm_eps)


def add_clipped(x: mx.array, y: mx.array) -> mx.array:
    """A residual add; in float16 clipped to its range (Gemma's activations overflow it)."""
    if x.dtype != mx.float16:
        return x + y
    bound = float(mx.finfo(mx.float16).max)
    return mx.clip(x.astype(mx.float32) + y.astype(mx.float32), -bound, bound).astype(mx.float16)


class SandwichBlock(FusedForms, nn.Module):
    """Gemma 2/3: h = x + norm(attn(norm(x))), then h + norm(mlp(norm(h))) (four norms of class
    ``norm``).

    Fused (``fuse``), a block whose norms share one eps and whose MLP is tanh-GELU (Gemma 2's
    and 3's) runs its small float32 forwards as one native operation (``native/block.h``'s
    sandwich block, with Gemma 2's attention soft-capping); every other
    forward (prefill chunks over ``SMALL_M_MAX`` rows, a GPU) takes the module path below,
    which is its pure-MLX twin (``tests/test_native_block.py``)."""

    sandwich = True

    def __init__(self, attn: Attention, mlp: GatedMLP, hidden: int, norm: Callable[[int], nn.Module]):
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.input_layernorm = norm(hidden)
        self.post_attention_layernorm = norm(hidden)
        self.pre_feedforward_layernorm = norm(hidden)
        self.post_feedforward_layernorm = norm(hidden)
        self._fused: FusedBlock | None = None

    def norms(self) -> tuple[nn.Module, ...]:
        """The four norms in the order a forward applies them."""
        return (self.input_layernorm, self.post_attention_layernorm,
                self.pre_feedforward_layernorm, self.post_feedforward_layernorm)

    def norm_factors(self) -> list[mx.array] | None:
        """What the native block scales each norm's rows by: ``1 + w`` of the four norms
        (``norms`` order), then of the q and k norms where the attention has them, as
        ``OffsetRMSNorm`` computes it; None where a norm is of another class."""
        a = self.self_attn
        norms = [*self.norms(), *((a.q_norm, a.k_norm) if a.q_norm is not None else ())]
        if any(type(n) is not OffsetRMSNorm for n in norms):
            return None
        return [1.0 + n.weight for n in norms]

    def __call__(self, x, positions, mask, cache, layer):
        if self._fused is not None and self._fused.current(self):
            out = self._fused.native_call(x, mask, cache, layer)
            if out is not None:
                return out
        r = self.self_attn(self.input_layernorm(x), positions, mask, cache, layer)
        h = add_clipped(x, self.post_attention_layernorm(r))
        r = self.mlp(self.pre_feedforward_layernorm(h))
        return add_clipped(h, self.post_feedforward_layernorm(r))
