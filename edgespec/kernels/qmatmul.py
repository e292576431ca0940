"""Small-M products with group-quantized weights in MLX's affine layout (``mx.quantize``):
``y = x @ dequantize(wq, scales, biases).T`` for float32 x (..., K), 4- or 8-bit wq (N, K·bits/32)
and float32 scales/biases (N, K/group_size).

``quantized_small_matmul`` is the op: the native kernel (``kernels/native/kernel_q_avx512.cpp``
and ``kernel_q_avx2.cpp``: each packed row dequantized 32 values at a time in registers and
used for all rows of x; for 4 bits, AVX-512 looks the weights up in a per-group table of the 16
values ``scale * q + bias`` with two vpermps per 16 packed bytes, x de-interleaved once per call
to match the low/high nibble order)
where ``backend.use_quantized_small_matmul`` chose it, else its pure-MLX twin
``quantized_small_matmul_mlx`` (``mx.quantized_matmul``, whose CPU form costs about M times its
one-row time: 12 ms for 8 rows of the demo's gate|up against 1.5 ms for one).
``quantized_small_matmul_native`` always runs the kernel. Agreement with the twin: within
1e-5 · Σ_k |x_k · w_k| of the dequantized weights (``tests/test_qmatmul.py``).
"""

from __future__ import annotations

import math

import mlx.core as mx

from . import native
from .backend import KernelError, use_quantized_small_matmul


def quantized_small_matmul_mlx(x, wq, scales, biases, group_size: int, bits: int) -> mx.array:
    """The pure-MLX twin."""
    return mx.quantized_matmul(x, wq, scales=scales, biases=biases, transpose=True,
                               group_size=group_size, bits=bits)


def quantized_small_matmul_native(x, wq, scales, biases, group_size: int, bits: int) -> mx.array:
    """The native kernel, whatever the shape; raises KernelError when it is not loaded or the
    layout is not one it takes."""
    mod = native.load()
    if mod is None:
        raise KernelError(f"the native kernels are not available: {native.status().reason}")
    try:
        return mod.quantized_small_matmul(x, wq, scales, biases, group_size, bits)
    except ValueError as e:
        raise KernelError(f"{e}; got x {tuple(x.shape)} {x.dtype}, wq {tuple(wq.shape)}, "
                          f"group_size {group_size}, bits {bits}") from None


def quantized_small_matmul(x, wq, scales, biases, group_size: int, bits: int) -> mx.array:
    """``x @ dequantize(...).T``, through the native kernel where the backend chose it."""
    if (x.ndim >= 1 and x.dtype == mx.float32 and scales.dtype == mx.float32 and biases is not None
            and use_quantized_small_matmul(math.prod(x.shape[:-1]), group_size, bits)):
        return native.load().quantized_small_matmul(x, wq, scales, biases, group_size, bits)
    return quantized_small_matmul_mlx(x, wq, scales, biases, group_size, bits)
