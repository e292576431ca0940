"""Small-M float32 products ``y = x @ w.T`` (x: (..., K), w: (N, K): a linear layer's weight).

``small_matmul`` is the op the model code calls: the native kernel (``kernels/native``: each
row of w streamed once for all rows of x, AVX-512/AVX2 FMA, N split over threads) where
``backend.use_small_matmul`` says it was measured faster, else its pure-MLX twin
``small_matmul_mlx`` (MLX's matmul, i.e. the BLAS). ``small_matmul_native`` always runs the
kernel (tests compare the two).

The kernel sums each output in one order whatever the number of rows, so a row's result does
not depend on the rows computed with it. (The backend may still pick the BLAS for one row and
the kernel for eight, as the BLAS's GEMV and GEMM also differ.) It and the twin agree to
float32 rounding: |kernel - twin| <= 1e-5 * sum_k |x_k w_k| (``tests/test_kernels.py``
checks this for random shapes).
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from . import native, qmatmul
from .backend import (KernelError, on_cpu, q8_form_runs, use_quantized_small_matmul,
                      use_small_matmul)
from .qmatmul import quantized_small_matmul, symmetric_biases


def small_matmul_mlx(x: mx.array, w: mx.array) -> mx.array:
    """The pure-MLX twin: ``x @ w.T``."""
    return x @ w.T


def _check(x: mx.array, w: mx.array) -> None:
    if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise KernelError(f"small_matmul needs x (..., K) and w (N, K) with the same K; "
                          f"got x {tuple(x.shape)} and w {tuple(w.shape)}")
    if x.dtype != mx.float32 or w.dtype != mx.float32:
        raise KernelError(f"small_matmul takes float32 x and w; got {x.dtype} and {w.dtype}")


def small_matmul_native(x: mx.array, w: mx.array) -> mx.array:
    """The native kernel, whatever the shape; raises KernelError when it is not loaded."""
    _check(x, w)
    mod = native.load()
    if mod is None:
        raise KernelError(f"the native kernels are not available: {native.status().reason}")
    return mod.small_matmul(x, w)


def small_matmul(x: mx.array, w: mx.array, exact: bool = False) -> mx.array:
    """``x @ w.T``, through the native kernel where the backend chose it for this shape
    (``exact``: at any work, ``backend.use_small_matmul``)."""
    if x.ndim >= 1 and w.ndim == 2 and x.dtype == w.dtype == mx.float32:
        m = math.prod(x.shape[:-1])
        if use_small_matmul(m, w.shape[0], w.shape[1], exact) and x.shape[-1] == w.shape[1]:
            return native.load().small_matmul(x, w)
    return small_matmul_mlx(x, w)


def _once(module: nn.Module, key: str, make):
    """``make(scales, biases)`` of a quantized module's arrays, made once for these arrays and
    its bits (MLX arrays never change in place: new weights are new arrays, made again; weights
    re-packed at another width keep their scales and biases, ``qmatmul.widen_for_native``) and
    kept in the module's ``__dict__`` under ``key``."""
    scales, biases, bits = module["scales"], module.get("biases"), module.bits
    seen = module.__dict__.get(key)
    if seen is None or seen[0] is not scales or seen[1] is not biases or seen[2] != bits:
        seen = (scales, biases, bits, make(scales, biases))
        module.__dict__[key] = seen
    return seen[3]


def symmetric(module: nn.Module) -> bool:
    """``qmatmul.symmetric_biases`` of a quantized module's scales and biases (False without
    biases), checked once for these arrays."""
    return _once(module, "_edgespec_symmetric", lambda s, b: b is not None
                 and symmetric_biases(s, b, module.bits))


def halves(module: nn.Module) -> tuple | None:
    """``qmatmul.half_scales`` of a bias-free affine quantized module's scales and biases,
    which ``linear`` hands the native kernel: made once for these arrays, on the CPU where
    the int8 form reads them (the float forms would widen them on every call); None where
    there are none."""
    if module.get("biases") is None or not on_cpu() or not q8_form_runs(module.bits):
        return None
    return _once(module, "_edgespec_halves", _evaluated_halves)


def _evaluated_halves(scales: mx.array, biases: mx.array) -> tuple | None:
    made = qmatmul.half_scales(scales, biases)
    if made is not None:
        mx.eval(made)
    return made


def linear(module: nn.Module, x: mx.array) -> mx.array:
    """A linear map applied to ``x``: a float32 ``nn.Linear`` or a float32 ``nn.Embedding``
    (the tied LM head) through ``small_matmul`` at any work (``exact``: a small product, such as
    an MoE router, takes the native kernel for one row as for several); an affine
    ``nn.QuantizedLinear`` /
    ``nn.QuantizedEmbedding`` through ``qmatmul``; a layer's bias added after the product (not
    inside MLX's fused product, whose rows may depend on how many come together: a biased
    projection then keeps the native kernels' row by row bits); any other module called as it
    is (an embedding through its ``as_linear``)."""
    if type(module) in (nn.QuantizedEmbedding, nn.QuantizedLinear) and module.mode == "affine":
        y = quantized_small_matmul(x, module["weight"], module["scales"], module.get("biases"),
                                   module.group_size, module.bits, symmetric(module),
                                   halves(module))
        return y + module["bias"] if "bias" in module else y
    if isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)):  # the tied LM head
        if type(module) is nn.Embedding and module.weight.dtype == mx.float32:
            return small_matmul(x, module.weight, exact=True)
        return module.as_linear(x)
    if type(module) is nn.Linear and module.weight.dtype == mx.float32:
        y = small_matmul(x, module.weight, exact=True)
        return y + module["bias"] if "bias" in module else y
    return module(x)


def linear_rows_exact(module: nn.Module, m: int) -> bool:
    """Whether ``linear(module, x)`` over ``m`` rows runs a native kernel, which computes each
    row by itself (its bits do not depend on the rows beside it); elsewhere MLX's product,
    whose rows may depend on how many come together."""
    if type(module) in (nn.QuantizedEmbedding, nn.QuantizedLinear) and module.mode == "affine":
        return use_quantized_small_matmul(m, module.group_size, module.bits)
    if type(module) in (nn.Embedding, nn.Linear) and module.weight.dtype == mx.float32:
        return use_small_matmul(m, *module.weight.shape, exact=True)
    return False
