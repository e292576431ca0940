"""Weights that start on a cache line, for the CPU kernels.

MLX's CPU allocator hands out large buffers 24 bytes past a 64-byte boundary on Linux (its size
header after glibc's), so every 64-byte load of a weight row straddles two cache lines. Where a
product is bound by the core rather than by memory (8-16 rows), the native kernel then loses
8-16% (a standalone harness on the 2-core Xeon VM, one thread, gate|up over 20 cold copies: 16
rows 437 -> 390 us, 8 rows 296 -> 272 us; one row, bound by memory, unchanged).
``aligned(w)`` returns the same values as a view that starts on a 64-byte boundary inside a
slightly larger buffer. Only speed changes: the kernels sum in the same order wherever the row
starts, so every output keeps its bits.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

BOUNDARY = 64  # bytes: a cache line, and one AVX-512 vector
_MIN_BYTES = 1 << 16  # smaller arrays are left as they are
_NUMPY_DTYPES = (mx.float32, mx.float16, mx.uint32, mx.int32, mx.uint8, mx.int8)


def address(a: mx.array) -> int:
    """Where ``a``'s (evaluated, row-contiguous) data starts in memory."""
    return int(np.asarray(a).__array_interface__["data"][0])


def is_aligned(a: mx.array) -> bool:
    return address(a) % BOUNDARY == 0


def aligned(a: mx.array) -> mx.array:
    """``a`` (evaluated) as a view starting on a 64-byte boundary, or ``a`` itself when it
    already does, is small, has a dtype numpy cannot view, or the allocator did not give the
    same offset twice (the alignment is a speed matter only)."""
    if a.dtype not in _NUMPY_DTYPES or a.nbytes < _MIN_BYTES:
        return a
    mx.eval(a)
    if is_aligned(a):
        return a
    size = a.dtype.size
    room = BOUNDARY // size  # elements of slack: enough for any start offset
    probe = mx.zeros((a.size + room,), a.dtype)
    mx.eval(probe)
    skip = (-address(probe)) % BOUNDARY
    del probe
    flat = a.reshape(-1)
    for _ in range(3):  # a buffer of this size lands at the probe's offset; check, else retry
        if skip % size:
            return a
        lead = skip // size
        buf = mx.concatenate([mx.zeros((lead,), a.dtype), flat, mx.zeros((room - lead,), a.dtype)])
        mx.eval(buf)
        now = (-address(buf)) % BOUNDARY
        if now == skip:
            view = buf[lead : lead + a.size].reshape(a.shape)
            mx.eval(view)
            return view if is_aligned(view) else a
        skip = now
    return a
