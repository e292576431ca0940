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
one-row time).
``quantized_small_matmul_native`` always runs the kernel. Agreement with the twin: within
1e-5 · Σ_k |x_k · w_k| of the dequantized weights (``tests/test_qmatmul.py``).

Int8 activations (the default where they run: ``backend.use_q8_activations``; 4 or 8 bits,
AVX-512 VNNI: ``kernels/native/kernel_q8_avx512.cpp``, AVX2: ``kernel_q8_avx2.cpp``, the same
bits on both; ``EDGESPEC_Q8_ACTIVATIONS=0`` keeps x in float32): each row of x is rounded per
32-value block to int8 q with scale d = max|x| / 127 (q = round-half-even(x / d)), the 4- or
8-bit values are multiplied with q exactly in int32 and scaled by group scale × d, plus
bias × d·Σq per block. Its twin ``quantized_small_matmul_q8_mlx`` rounds x the same way in MLX
and multiplies ``d * q`` with the dequantized weights in float32; agreement: within 1e-5 ·
Σ_k |x̂_k · w_k|, x̂ = d·q. A row's result does not depend on the other rows either way, so a
verify of many tokens gives each token the bits it gets alone.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from . import native
from .backend import (KernelError, native_enabled, use_q8_activations,
                      use_quantized_small_matmul)


def quantized_small_matmul_mlx(x, wq, scales, biases, group_size: int, bits: int) -> mx.array:
    """The pure-MLX twin."""
    return mx.quantized_matmul(x, wq, scales=scales, biases=biases, transpose=True,
                               group_size=group_size, bits=bits)


def round_x8(x) -> mx.array:
    """x (..., K) with each 32-value block rounded to d * q, q int8, d = max|x| / 127 (the int8
    activations' rounding, as the native kernel does it)."""
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    d = mx.max(mx.abs(xb), axis=-1, keepdims=True) / 127
    q = mx.where(d > 0, mx.round(xb / mx.where(d > 0, d, 1)), 0)
    return (q * d).reshape(x.shape)


def quantized_small_matmul_q8_mlx(x, wq, scales, biases, group_size: int, bits: int) -> mx.array:
    """The pure-MLX twin of the int8-activation kernel."""
    return quantized_small_matmul_mlx(round_x8(x), wq, scales, biases, group_size, bits)


def symmetric_biases(scales: mx.array, biases: mx.array, bits: int) -> bool:
    """Whether every bias is -2^(bits - 1) times its scale, exactly: a symmetric format (GGUF's
    Q8_0 and Q4_0). Then the AVX-512 VNNI int8 form makes the biases from the scales (a
    multiply by a power of two: the same values, the same bits) and never streams them."""
    return mx.array_equal(biases, scales * -float(2 ** (bits - 1))).item()


def half_scales(scales: mx.array, biases: mx.array) -> tuple[mx.array, mx.array] | None:
    """Float16 copies of a quantized weight's float32 scales and biases where every one is a
    float16 number (GGUF's Q4_0, Q4_1 and Q8_0 store them as float16), else None. The native
    products widen them exactly, so they compute the same bits and read half the bytes for
    them (``native/quantized_matmul.h``): with float32 ones, a third of a 4-bit product's
    traffic is its scales and biases."""
    if scales.dtype != mx.float32 or biases.dtype != mx.float32:
        return None
    halves = scales.astype(mx.float16), biases.astype(mx.float16)
    exact = mx.array_equal(halves[0].astype(mx.float32), scales) and mx.array_equal(
        halves[1].astype(mx.float32), biases)
    return halves if exact.item() else None


NATIVE_BITS = (4, 8)  # the widths the native products and ``quantized_rows`` take


def native_width(bits: int) -> int | None:
    """The width the native kernels take for ``bits``-bit weights: ``bits`` itself where they
    take it, else the next wider one (1 to 3 bits: 4; 5 and 6 bits: 8); None above 8."""
    return next((w for w in NATIVE_BITS if w >= bits), None)


_WIDEN_CHUNK = 1 << 22  # values re-packed at a time (a chunk's uint32 lanes take 16 MB)


def widen_packed(wq: mx.array, bits: int, to: int) -> mx.array:
    """MLX's packing of ``bits``-bit values (N, K·bits/32 uint32: each row a little-endian bit
    stream, every 8 values in ``bits`` bytes) re-packed as ``to``-bit values, ``to`` 4 or 8
    and at least ``bits``: (N, K·to/32), the same values. With the same scales and biases
    the weights dequantize to the same numbers, bit for bit (``tests/test_widen.py``)."""
    if to not in NATIVE_BITS or not 1 <= bits <= to:
        raise ValueError(f"cannot widen {bits}-bit weights to {to} bits (to 4 or 8, not narrower)")
    n, words = wq.shape
    k = words * 32 // bits
    rows = max(1, _WIDEN_CHUNK // max(k, 1))
    mask = (1 << bits) - 1
    parts = []
    for a in range(0, n, rows):
        b = wq[a : a + rows].view(mx.uint8).reshape(-1, k // 8, bits).astype(mx.uint32)
        # 8 values in ``bits`` bytes: value i starts at bit bits * i of that little-endian run
        q = []
        for i in range(8):
            lo, shift = divmod(bits * i, 8)
            v = b[..., lo] >> shift
            if shift + bits > 8:  # the value runs into the next byte
                v = v | (b[..., lo + 1] << (8 - shift))
            q.append((v & mask).astype(mx.uint8))
        q = mx.stack(q, axis=-1).reshape(-1, k)  # (rows, K) values, K in order
        if to == 4:
            q = q[:, 0::2] | (q[:, 1::2] << 4)
        part = q.reshape(-1, k * to // 32, 4).view(mx.uint32).reshape(-1, k * to // 32)
        mx.eval(part)
        parts.append(part)
    return parts[0] if len(parts) == 1 else mx.concatenate(parts)


def widen_for_native(model: nn.Module) -> dict[tuple[int, int], int]:
    """Re-pack every affine ``nn.QuantizedLinear`` and ``nn.QuantizedEmbedding`` of ``model``
    whose bits the native kernels lack (1, 2, 3, 5, 6) at the next width they take
    (``native_width``), with its scales and biases unchanged: the same weights exactly, at more
    bytes (5 bits: 8/5 of the packed bytes). MLX's own CPU product for those widths costs about
    a native 4- or 8-bit one's tenfold (docs/measurements.md, "Gemma 3 on the quantized path"),
    so ``load_target`` calls this where the native kernels run; elsewhere (Metal, a CPU without
    them) MLX's product of the file's width costs no more and nothing is re-packed. What
    ``kernels/matmul`` made for a layer's old width is made again (its ``_once`` is keyed on the
    bits too). Returns {(from, to): layers re-packed}."""
    done: dict[tuple[int, int], int] = {}
    for _, module in model.named_modules():
        if (type(module) not in (nn.QuantizedLinear, nn.QuantizedEmbedding)
                or module.mode != "affine" or module.group_size not in (32, 64, 128)):
            continue
        to = native_width(module.bits)
        if to is None or to == module.bits:
            continue
        module.weight = widen_packed(module["weight"], module.bits, to)
        done[(module.bits, to)] = done.get((module.bits, to), 0) + 1
        module.bits = to
    return done


def match_widths(mods: list[nn.Module]) -> int:
    """Re-pack the narrower of affine ``nn.QuantizedLinear`` layers that one product joins
    (a block's q/k/v, its gate/up) at the widest one's bits, their scales and biases unchanged:
    the same weights exactly, so that the block's fused form, which joins them only where they
    are alike (``fused_block.quant_key``), exists. A GGUF Q4_K_M file keeps q and k at 4 bits
    and v at 6 (8 once rounded) in half its layers. Only native widths (4, 8) and one group
    size; returns how many layers were re-packed (4 to 8 bits)."""
    if not all(type(m) is nn.QuantizedLinear and m.mode == "affine" for m in mods):
        return 0
    bits = {m.bits for m in mods}
    if len(bits) < 2 or not bits <= set(NATIVE_BITS) or len({m.group_size for m in mods}) != 1:
        return 0
    to, done = max(bits), 0
    for m in mods:
        if m.bits != to:
            m.weight = widen_packed(m["weight"], m.bits, to)
            m.bits, done = to, done + 1
    return done


def embedding_rows(module: nn.Module, ids: mx.array) -> mx.array:
    """``module(ids)``: the embedding of token ids. An ``nn.QuantizedEmbedding`` in the affine
    layout with float32 scales and biases takes the native ``quantized_rows`` where the native
    kernels run: one operation with the module's bits, where the module's gathers and
    dequantization make some thirty, each one a forward's host work. Any other module, or
    elsewhere, is called as it is (its pure-MLX twin)."""
    if (type(module) is nn.QuantizedEmbedding and module.mode == "affine"
            and module.bits in NATIVE_BITS and module.group_size in (32, 64, 128)
            and module.get("biases") is not None and module["scales"].dtype == mx.float32
            and module["biases"].dtype == mx.float32 and ids.dtype in (mx.int32, mx.uint32)
            and native_enabled()):
        mod = native.load()
        if hasattr(mod, "quantized_rows"):
            return mod.quantized_rows(ids, module["weight"], module["scales"], module["biases"],
                                      module.group_size, module.bits)
    return module(ids)


def quantized_small_matmul_native(x, wq, scales, biases, group_size: int, bits: int,
                                  q8: bool = False, symmetric: bool = False) -> mx.array:
    """The native kernel, whatever the shape (``q8``: with int8 activations; ``symmetric``: as
    ``symmetric_biases`` found it); raises KernelError when it is not loaded or the layout is
    not one it takes."""
    mod = native.load()
    if mod is None:
        raise KernelError(f"the native kernels are not available: {native.status().reason}")
    try:
        return mod.quantized_small_matmul(x, wq, scales, biases, group_size, bits, q8,
                                          symmetric)
    except ValueError as e:
        raise KernelError(f"{e}; got x {tuple(x.shape)} {x.dtype}, wq {tuple(wq.shape)}, "
                          f"group_size {group_size}, bits {bits}") from None


def quantized_small_matmul(x, wq, scales, biases, group_size: int, bits: int,
                           symmetric: bool = False, halves: tuple | None = None) -> mx.array:
    """``x @ dequantize(...).T``, through the native kernel where the backend chose it
    (``symmetric``: as ``symmetric_biases`` found it, which the caller checked; ``halves``:
    ``half_scales`` of the scales and biases, which the native kernel then reads instead)."""
    if (x.ndim >= 1 and x.dtype == mx.float32 and scales.dtype == mx.float32 and biases is not None
            and use_quantized_small_matmul(math.prod(x.shape[:-1]), group_size, bits)):
        scales, biases = halves or (scales, biases)
        return native.load().quantized_small_matmul(x, wq, scales, biases, group_size, bits,
                                                     use_q8_activations(bits), symmetric)
    return quantized_small_matmul_mlx(x, wq, scales, biases, group_size, bits)
