"""RMSNorm and the q|k|v split with RoPE, the small operations around a block's products.

On MLX's CPU backend ``mx.fast.rms_norm`` and ``mx.fast.rope`` fall back to compositions of
elementwise operations, and each MLX operation costs microseconds whatever its size, so the
norms, RoPE and the split, reshapes and transposes of q|k|v were a large share of a small
model's float32 forward (see docs/measurements.md, "per-operation costs"). The native ops
(``native/rope_norm.h``) do each in one operation; ``rms_norm`` and ``qkv_rope`` run them where
``backend.use_native_block_ops`` says, else their pure-MLX twins ``rms_norm_twin`` /
``qkv_rope_twin``. Each row is computed on its own either way, so a row's result does not
depend on the rows computed with it. The native ops agree with the twins within float32
rounding: 1e-5 relative for the norm, 2e-6 plus the angle's rounding (position x 1e-7) for RoPE
(``tests/test_rope_norm.py``).
"""

from __future__ import annotations

import mlx.core as mx

from . import native
from .backend import use_native_block_ops


def rope(x: mx.array, positions, dims: int, mscale: float = 1.0, **kw) -> mx.array:
    """RoPE over the first ``dims`` features (none when 0; those scaled by ``mscale`` first) for a
    chain (int or scalar offset) or a tree (one position per token)."""
    if dims == 0:
        return x
    if mscale != 1.0:
        x = mx.concatenate([x[..., :dims] * mscale, x[..., dims:]], axis=-1)
    if isinstance(positions, int) or positions.ndim == 0:
        return mx.fast.rope(x, dims, offset=positions, **kw)
    # (1, H, N, D) -> (N, H, 1, D): one rope offset per batch element = per tree node
    y = mx.fast.rope(x.transpose(2, 1, 0, 3), dims, offset=positions, **kw)
    return y.transpose(2, 1, 0, 3)


def inverse_frequencies(dims: int, base: float | None, freqs: mx.array | None) -> mx.array:
    """RoPE's angle per position for each of the ``dims // 2`` feature pairs, as ``mx.fast.rope``
    computes it: ``1 / freqs`` when given, else ``base ** (-j / (dims / 2))``."""
    if freqs is not None:
        return (1.0 / freqs).astype(mx.float32)
    return mx.power(base, -mx.arange(0, dims // 2, dtype=mx.float32) / (dims // 2))


def rms_norm_twin(x: mx.array, w: mx.array, eps: float) -> mx.array:
    return mx.fast.rms_norm(x, w, eps)


def rms_norm(x: mx.array, w: mx.array, eps: float) -> mx.array:
    """``x * rsqrt(mean(x**2, -1) + eps) * w``: the native op for float32 on the CPU, else MLX's."""
    if x.dtype == mx.float32 and w.dtype == mx.float32 and use_native_block_ops():
        return native.load().rms_norm(x, w, eps)
    return rms_norm_twin(x, w, eps)


def qkv_rope_twin(y: mx.array, positions, inv_freq: mx.array, heads: int, kv_heads: int,
                  head_dim: int, dims: int, traditional: bool, mscale: float, scale: float,
                  base: float | None, freqs: mx.array | None):
    """The pure-MLX twin of ``qkv_rope`` (``inv_freq`` unused: mx.fast.rope takes base/freqs)."""
    B, N, _ = y.shape
    nq, nk = heads * head_dim, kv_heads * head_dim
    q, k, v = mx.split(y, [nq, nq + nk], axis=-1)
    q = q.reshape(B, N, heads, head_dim).transpose(0, 2, 1, 3)
    k = k.reshape(B, N, kv_heads, head_dim).transpose(0, 2, 1, 3)
    v = v.reshape(B, N, kv_heads, head_dim).transpose(0, 2, 1, 3)
    kw = dict(traditional=traditional, base=base, scale=scale, freqs=freqs)
    return rope(q, positions, dims, mscale, **kw), rope(k, positions, dims, mscale, **kw), v


def qkv_rope(y: mx.array, positions, inv_freq: mx.array, heads: int, kv_heads: int,
             head_dim: int, dims: int, traditional: bool, mscale: float, scale: float,
             base: float | None, freqs: mx.array | None):
    """Split a q|k|v product ``y`` (B, N, (heads + 2 kv_heads) head_dim) into q (B, heads, N,
    head_dim), k and v (B, kv_heads, N, head_dim), RoPE on the first ``dims`` features of q and k
    at ``positions`` (an int32 scalar offset, or one position per token). The native op for
    float32 batch 1 on the CPU, else the twin."""
    B, N, _ = y.shape
    if B == 1 and y.dtype == mx.float32 and use_native_block_ops() \
            and not isinstance(positions, int) and positions.dtype == mx.int32:
        return tuple(native.load().qkv_rope(y.reshape(N, -1), positions, inv_freq, heads,
                                            kv_heads, head_dim, dims, traditional, mscale, scale))
    return qkv_rope_twin(y, positions, inv_freq, heads, kv_heads, head_dim, dims, traditional,
                         mscale, scale, base, freqs)
