"""Acceptance on the device: the greedy walk and the sampling rule of ``verify.py`` as Metal
kernels, returning the accepted path and the bonus token (a few integers read back instead of
N x V logits).

``accept_greedy(parents, tokens, argmax, mode)``: ``argmax`` (N,) the target's greedy token per
node (``mx.argmax`` of the logits, on the device); equals ``verify.verify_greedy`` exactly.
``accept_sampling(parents, tokens, p, q, uniforms, mode)``: ``verify.verify_sampling_uniforms``
given the same uniforms (``uniforms[c]`` for child c's accept test, ``uniforms[0]`` for the bonus
draw); the kernel works in float32 where the host rule works in float64, so the two can differ
only when a uniform falls within float32 rounding of a threshold. ``mode``: "metal" or "emulate"
(``backend.metal_kernels``); ``verify.accept`` runs the numpy rules (the twins) when it is "off".
Both return (path: list of node indices from the root 0, bonus token).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .backend import KernelError
from .metal import kernel
from .tree_mask import MAX_NODES


def _tree(parents, tokens) -> tuple[mx.array, mx.array, int]:
    n = len(parents)
    if not 1 <= n <= MAX_NODES or len(tokens) != n:
        raise KernelError(f"acceptance kernels take trees of 1..{MAX_NODES} nodes with a token "
                          f"per node; got {n} parents and {len(tokens)} tokens")
    return mx.array(np.asarray(parents, np.int32)), mx.array(np.asarray(tokens, np.int32)), n


def _result(path: mx.array, info: mx.array) -> tuple[list[int], int]:
    info = np.array(info)
    return [int(u) for u in np.array(path)[: int(info[0])]], int(info[1])


def accept_greedy(parents, tokens, argmax: mx.array, mode: str) -> tuple[list[int], int]:
    par, tok, n = _tree(parents, tokens)
    path, info = kernel("accept_greedy")(
        mode, [argmax.astype(mx.int32).reshape(n), par, tok, mx.array([n], dtype=mx.int32)],
        grid=(64, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(n,), (2,)],
        output_dtypes=[mx.int32, mx.int32])
    return _result(path, info)


def accept_sampling(parents, tokens, p, q, uniforms, mode: str) -> tuple[list[int], int]:
    par, tok, n = _tree(parents, tokens)
    p = mx.array(np.asarray(p, np.float32)) if not isinstance(p, mx.array) else p.astype(mx.float32)
    if p.ndim != 2 or p.shape[0] != n:
        raise KernelError(f"p must be (N = {n}, V); got {tuple(p.shape)}")
    V = p.shape[1]
    if q is None:
        q_arr, has_q = mx.zeros((1, 1), mx.float32), 0
    else:
        q_np = np.asarray(q, np.float32)
        if q_np.shape[0] != n or q_np.shape[1] > V:
            raise KernelError(f"q must be (N = {n}, at most V = {V}); got {q_np.shape}")
        if q_np.shape[1] < V:
            q_np = np.pad(q_np, ((0, 0), (0, V - q_np.shape[1])))
        q_arr, has_q = mx.array(q_np), 1
    u = mx.array(np.asarray(uniforms, np.float32).reshape(n))
    path, info, _ = kernel("accept_sampling")(
        mode, [p, q_arr, tok, par, u, mx.array([n, V, has_q], dtype=mx.int32)],
        grid=(256, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(n,), (2,), (V,)],
        output_dtypes=[mx.int32, mx.int32, mx.float32])
    return _result(path, info)
