"""Tree attention: N <= 64 tree nodes attending to the cached keys plus the tree's own keys,
the mask given as a :class:`TreeMask` (ancestor bitmask + positions + window) instead of a
dense matrix.

``tree_attention(q, k, v, scale, mask, softcap)`` runs where ``backend.metal_kernels`` says: the
Metal kernel (``kernels_metal/tree_attention.metal``) on a Mac's GPU or in emulation; else, on
the CPU with the native kernels, the C++ kernel (``kernels/native/attention_core.inc``: float32,
one operation per layer, a node's result independent of the other nodes, as plain decoding
needs); else the pure-MLX twin ``tree_attention_twin`` (``attention.attend`` over
``mask.dense()``). The C++ kernel agrees with the twin within 2e-6 relative to max |v|
(``tests/test_tree_attention_native.py``).
Shapes: q (1, H, N, D), k/v (1, H_kv, L + N, D) (what ``cache.write`` returns: the L committed
slots, then the tree's N), H a multiple of H_kv (query head h reads kv head h // (H / H_kv)),
D <= 256; float32, float16 or bfloat16. The kernel scores and accumulates in float32 with an
online softmax; it agrees with the twin within 2e-5 (float32) / 2e-2 (float16, bfloat16:
the twin's own rounding) relative to max |v| (``tests/test_metal_kernels.py``).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .attention import attend
from . import native
from .backend import KernelError, metal_kernels, use_native_tree_attention
from .metal import kernel
from .tree_mask import MAX_NODES, TreeMask

MAX_D = 256
DTYPES = (mx.float32, mx.float16, mx.bfloat16)


def tree_attention_twin(q, k, v, scale: float, mask: TreeMask, softcap: float | None = None):
    return attend(q, k, v, scale, mask.dense(), softcap)


def _check(q, k, v, mask: TreeMask) -> None:
    B, H, N, D = q.shape
    if B != 1 or k.shape[0] != 1 or k.shape != v.shape:
        raise KernelError(f"tree_attention takes batch 1 and k, v of one shape; got q "
                          f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if N != mask.nodes or not 1 <= N <= MAX_NODES:
        raise KernelError(f"tree_attention takes 1..{MAX_NODES} nodes, as many as the mask's "
                          f"({mask.nodes}); got {N}")
    if k.shape[2] != mask.cached + N or H % k.shape[1] or D > MAX_D or k.shape[3] != D:
        raise KernelError(f"tree_attention needs k (1, H_kv, L + N = {mask.cached + N}, D <= "
                          f"{MAX_D}) with H = {H} a multiple of H_kv; got {tuple(k.shape)}")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise KernelError(f"tree_attention takes float32, float16 or bfloat16 q, k, v of one "
                          f"dtype; got {q.dtype}, {k.dtype}, {v.dtype}")


def tree_attention_kernel(q, k, v, scale: float, mask: TreeMask, softcap: float | None,
                          mode: str) -> mx.array:
    """The Metal kernel (``mode`` "metal" or "emulate"), whatever the backend's choice."""
    _check(q, k, v, mask)
    _, H, N, D = q.shape
    hkv, S = k.shape[1], k.shape[2]
    ip = np.array([N, S, mask.cached, H, hkv, D, mask.key_start, mask.window or 0], np.int32)
    fp = np.array([scale, softcap or 0.0], np.float32)
    (out,) = kernel("tree_attention")(
        mode, [q, k, v, mx.array(mask.anc), mx.array(mask.qpos), mx.array(ip), mx.array(fp)],
        template=[("T", q.dtype)], grid=(32, N, H), threadgroup=(32, 1, 1),
        output_shapes=[(1, H, N, D)], output_dtypes=[q.dtype])
    return out


def tree_attention_native(q, k, v, scale: float, mask: TreeMask, softcap: float | None = None):
    """The native CPU kernel, whatever the backend's choice (float32 q, k, v)."""
    _check(q, k, v, mask)
    try:
        anc, qpos = mask.device_arrays
        return native.load().tree_attention(q, k, v, anc, qpos, mask.key_start, mask.window or 0,
                                            scale, softcap or 0.0)
    except ValueError as e:
        raise KernelError(str(e)) from None


def tree_attention(q, k, v, scale: float, mask: TreeMask, softcap: float | None = None):
    """Softmax attention under ``mask``: the kernel where the backend runs it, else the twin."""
    mode = metal_kernels()
    if mode == "off":
        if q.dtype == mx.float32 and k.dtype == mx.float32 and use_native_tree_attention():
            return tree_attention_native(q, k, v, scale, mask, softcap)
        return tree_attention_twin(q, k, v, scale, mask, softcap)
    return tree_attention_kernel(q, k, v, scale, mask, softcap, mode)
