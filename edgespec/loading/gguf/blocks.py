"""GGUF's block-quantized tensors, decoded from their raw blocks (``mx.load`` fails on a whole
file as soon as one tensor has a type it lacks, such as Q5_0 or Q6_K, and reads Q4_K wrongly).

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q5_K store, for each run of 32 weights, integers ``q``
and one affine map ``w = scale * q + bias``: exactly MLX's affine quantization with group size
32 (4, 5 or 8 bits). :func:`to_affine` returns that triplet (``weight`` packed as MLX packs it: a
little-endian bit stream per row in uint32 words), so the tensors stay quantized and dequantize
to the file's values. ``scales``/``biases`` are float16 for the legacy types (their scale is a
float16 and the bias a power-of-two multiple of it or a float16) and float32 for the k-quants
(``d * sc``, a float16 times a 6-bit integer, needs more than float16's 11 bits).

Q6_K has one scale per 16 weights, a group size MLX does not have; :func:`to_dense` returns it
(and any type in ``DENSE_DECODED``) as float32 through the ``gguf`` package's reference
dequantizer. The tests check every decoder here against ``gguf.quants.dequantize``.

Block layouts (ggml's): Q8_0 = f16 d, 32 int8 (w = d * q); Q4_0 = f16 d, 16 bytes of nibbles
(w = d * (q - 8)); Q4_1 = f16 d, f16 m, nibbles (w = d * q + m);
Q5_0 = f16 d, u32 high bits, 16 bytes of nibbles (w = d * (q - 16));
Q5_1 = f16 d, f16 m, u32 high bits, nibbles (w = d * q + m); Q4_K = f16 d, f16 dmin, 12 bytes
of eight 6-bit scale/min pairs, 128 bytes of nibbles (w = d * sc * q - dmin * m per 32);
Q5_K = Q4_K plus 32 bytes of high bits before the nibbles.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as T

GROUP_SIZE = 32
AFFINE_BITS = {T.Q4_0: 4, T.Q4_1: 4, T.Q8_0: 8, T.Q5_0: 5, T.Q5_1: 5, T.Q4_K: 4, T.Q5_K: 5}
FLOAT16_SCALES = (T.Q4_0, T.Q4_1, T.Q8_0, T.Q5_0, T.Q5_1)
DENSE_DECODED = (T.Q6_K,)
_CHUNK = 1 << 22  # weights decoded at a time (bounds the temporary arrays)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """(n, 1) float32 of the float16 at byte ``start`` of each block."""
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles_32(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32): low nibbles are weights 0-15, high nibbles 16-31."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=1)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """(n, 4) bytes of a little-endian u32 -> (n, count) bits."""
    return np.unpackbits(qh, axis=1, bitorder="little")[:, :count]


def _q8_0(b: np.ndarray):
    d = _f16(b, 0)
    return b[:, 2:34].view(np.int8).astype(np.int16) + 128, d, -128 * d


def _q4_0(b: np.ndarray):
    d = _f16(b, 0)
    return _nibbles_32(b[:, 2:18]), d, -8 * d


def _q4_1(b: np.ndarray):
    return _nibbles_32(b[:, 4:20]), _f16(b, 0), _f16(b, 2)


def _q5_0(b: np.ndarray):
    d = _f16(b, 0)
    q = _nibbles_32(b[:, 6:22]) | (_high_bits(b[:, 2:6], 32) << 4)
    return q, d, -16 * d


def _q5_1(b: np.ndarray):
    q = _nibbles_32(b[:, 8:24]) | (_high_bits(b[:, 4:8], 32) << 4)
    return q, _f16(b, 0), _f16(b, 2)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 bytes -> eight 6-bit scales and mins: (n, 8) each. Pairs 0-3 sit in the low 6 bits of
    bytes 0-3 (scales) and 4-7 (mins); pairs 4-7 in the nibbles of bytes 8-11 with their top
    two bits in the top bits of bytes 0-3 (scales) and 4-7 (mins)."""
    s = s.astype(np.uint16)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 128) bytes -> (n, 8, 32): each 32-byte run holds two sub-blocks (low, high nibbles)."""
    qs = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([qs & 0xF, qs >> 4], axis=2).reshape(-1, 8, 32)


def _q4_k(b: np.ndarray):
    sc, mn = _k_scales(b[:, 4:16])
    return _k_nibbles(b[:, 16:144]), _f16(b, 0) * sc, -_f16(b, 2) * mn


def _q5_k(b: np.ndarray):
    sc, mn = _k_scales(b[:, 4:16])
    high = (b[:, None, 16:48] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # (n, 8, 32)
    return _k_nibbles(b[:, 48:176]) | (high << 4), _f16(b, 0) * sc, -_f16(b, 2) * mn


_DECODERS = {T.Q8_0: _q8_0, T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1,
             T.Q4_K: _q4_k, T.Q5_K: _q5_k}


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """(rows, cols) ints < 2**bits -> MLX's packing: each row a little-endian bit stream (every
    8 values fill ``bits`` bytes), in uint32 words."""
    rows, cols = q.shape
    if bits == 8:
        return np.ascontiguousarray(q, dtype=np.uint8).view(np.uint32)
    if bits == 4:
        q = q.astype(np.uint8)
        return np.ascontiguousarray(q[:, 0::2] | (q[:, 1::2] << 4)).view(np.uint32)
    eight = q.astype(np.uint64).reshape(rows, cols // 8, 8) << (bits * np.arange(8, dtype=np.uint64))
    packed = np.bitwise_or.reduce(eight, axis=-1)  # (rows, cols / 8) of 8*bits used bits
    data = packed[..., None].view(np.uint8)[..., :bits]  # little-endian bytes of each
    return np.ascontiguousarray(data).reshape(rows, cols * bits // 8).view(np.uint32)




def to_affine(data: np.ndarray, qtype: T, rows: int, cols: int) -> dict[str, mx.array]:
    """The raw blocks of a (rows, cols) tensor of a type in ``AFFINE_BITS`` as MLX's affine
    triplet ``{"weight", "scales", "biases"}`` with group size 32."""
    block_size, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = np.asarray(data, dtype=np.uint8).reshape(-1, block_bytes)
    per_row = cols // block_size
    step = max(1, _CHUNK // cols)
    scale_type = np.float16 if qtype in FLOAT16_SCALES else np.float32
    parts = []
    for r in range(0, rows, step):
        q, scales, biases = _DECODERS[qtype](blocks[r * per_row:(r + step) * per_row])
        n = q.size // cols
        parts.append((_pack(q.reshape(n, cols), AFFINE_BITS[qtype]),
                      scales.reshape(n, -1).astype(scale_type), biases.reshape(n, -1).astype(scale_type)))
    return {name: mx.array(np.concatenate([p[i] for p in parts]))
            for i, name in enumerate(("weight", "scales", "biases"))}


def to_dense(data: np.ndarray, qtype: T, rows: int, cols: int) -> mx.array:
    """The (rows, cols) float32 values of a block-quantized tensor (``gguf``'s dequantizer)."""
    return mx.array(quants.dequantize(np.asarray(data), qtype).reshape(rows, cols))
