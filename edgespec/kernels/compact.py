"""Keeping the accepted path: the rows of a layer's keys/values that the cache moves to the
slots after its committed prefix.

``move_rows(buffers, firsts, path)`` moves them on the CPU: the native operation
(``native/move_rows.h``), one per buffer, which writes only the moved rows in the buffer's own
memory when the cache holds it alone and copies it otherwise. It declines (None) where the native
module does not run or Metal kernels are asked for; ``KVCache.commit`` then gathers:

``gather_rows(keys, values, first, path)`` returns the rows ``first + path[j]`` of keys and
values (each (1, H_kv, capacity, D)) as (1, H_kv, len(path), D) arrays; ``KVCache.commit``
stores them at slots ``first ..`` with one slice update. Where ``backend.metal_kernels`` runs
the kernels it is ``kernels_metal/compact_kv.metal`` (MLX's kernel outputs are new arrays and
cannot alias the cache, so the kernel writes only the moved rows; "in place" is the slice update
that follows, which MLX does in the cache's buffer when nothing else holds it), else the twin
``gather_rows_twin`` (MLX indexing, what the cache always did).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from . import native
from .backend import KernelError, metal_kernels, native_enabled
from .metal import kernel


def gather_rows_twin(keys, values, first: int, path: list[int]):
    idx = mx.array([first + j for j in path])
    return keys[..., idx, :], values[..., idx, :]


def gather_rows_kernel(keys, values, first: int, path: list[int], mode: str):
    if keys.ndim != 4 or keys.shape[0] != 1 or values.shape[:3] != keys.shape[:3]:
        raise KernelError(f"compact_kv takes keys/values (1, H_kv, S, D) with the same H_kv and "
                          f"S; got {tuple(keys.shape)} and {tuple(values.shape)}")
    _, hkv, S, D = keys.shape
    DV, n = values.shape[3], len(path)
    rows = np.asarray([first + j for j in path], np.int32)
    if n == 0 or rows.min() < 0 or rows.max() >= S:
        raise KernelError(f"compact_kv rows must lie in 0..{S - 1}; got {rows.tolist()}")
    kout, vout = kernel("compact_kv")(
        mode, [keys, values, mx.array(rows), mx.array([hkv, S, D, DV, n], dtype=mx.int32)],
        grid=(32, n, hkv), threadgroup=(32, 1, 1),
        output_shapes=[(1, hkv, n, D), (1, hkv, n, DV)], output_dtypes=[keys.dtype, values.dtype])
    return kout, vout


def gather_rows(keys, values, first: int, path: list[int]):
    mode = metal_kernels()
    if mode == "off":
        return gather_rows_twin(keys, values, first, path)
    return gather_rows_kernel(keys, values, first, path, mode)


def move_rows(buffers: list[mx.array], firsts: list[int], path: list[int]) -> list[mx.array] | None:
    """``buffers`` (each (1, H_kv, capacity, D)) with rows ``firsts[b] + path[j]`` at
    ``firsts[b] + j``, through the native operation, or None where it does not run: Metal
    kernels asked for, no native module, or what the operation does not take (a batch of more
    than one, a path not strictly increasing), which the gather then handles as it always did."""
    if metal_kernels() != "off" or not native_enabled():
        return None
    if any(b.ndim != 4 or b.shape[0] != 1 for b in buffers) or any(
            b <= a for a, b in zip(path, path[1:])) or not path or path[0] < 0:
        return None
    return native.load().move_rows(buffers, firsts, path)
