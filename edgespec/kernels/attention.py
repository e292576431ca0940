"""Softmax attention (and the normalisation of a forward's positions and mask), per backend.

On Metal and CUDA, ``mx.fast.scaled_dot_product_attention`` and ``nn.silu`` are fused kernels
and are used as they are. On the CPU backend both end in MLX's elementwise ``exp``/``sigmoid``,
which were measured at several times the per-element cost of ``mx.power(e, x)``, enough to
make the softmax a large share of a verify forward (see docs/measurements.md, "Figures that
stood in the design text"). So on the CPU the softmax and SiLU are written out with ``power`` (same math; results
differ from the library ops in the last bit or so, for plain decoding and speculation alike,
which is all that losslessness needs).
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from .backend import on_cpu
from .tree_mask import TreeMask


def prepare(positions, mask):
    """Normalise a forward's ``positions`` (int or per-node array) to an int32 array and a
    boolean ``mask`` to the additive form ``attend`` uses (a ``TreeMask`` stays); idempotent."""
    if isinstance(positions, (int, np.integer)):
        positions = mx.array(int(positions), dtype=mx.int32)
    elif isinstance(positions, np.ndarray):
        positions = mx.array(positions.astype(np.int32))
    if isinstance(mask, TreeMask):
        return positions, mask
    if isinstance(mask, np.ndarray):
        mask = mx.array(mask)
    if mask is not None and mask.dtype == mx.bool_ and on_cpu():
        mask = mx.where(mask, 0.0, -math.inf).astype(mx.float32)
    return positions, mask


def attend(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array | None,
           softcap: float | None = None, sinks: mx.array | None = None) -> mx.array:
    """Softmax attention of q (B, H, N, D) over k/v (B, H_kv, T, D) with an optional mask
    (boolean "may attend", or additive) broadcastable to (N, T), or a ``TreeMask`` (the tree
    attention op: ``tree_attention.py``). ``softcap``: scores become
    ``softcap * tanh(scores / softcap)`` before the mask (Gemma 2's attention logit capping).
    ``sinks`` (H,): one extra logit per head in the softmax's denominator that attends to no
    value (gpt-oss); the tree attention kernels take none, so with sinks a ``TreeMask`` is
    expanded (``dense()``) and the written-out path below runs."""
    if isinstance(mask, TreeMask):
        if sinks is None:
            from .tree_attention import tree_attention  # it attends through this module (its twin)
            return tree_attention(q, k, v, scale, mask, softcap)
        mask = mask.dense()
    cpu = on_cpu()
    if not cpu and softcap is None:
        extra = {} if sinks is None else {"sinks": sinks}
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask, **extra)
    B, H, N, D = q.shape
    kv, T = k.shape[1], k.shape[2]
    rep = H // kv  # query heads sharing one key/value head, adjacent in H
    scores = ((q * scale).reshape(B, kv, rep * N, D) @ k.swapaxes(-1, -2)).reshape(B, kv, rep, N, T)
    if softcap is not None:
        scores = mx.tanh(scores / softcap) * softcap
    if mask is not None:
        if mask.dtype == mx.bool_:
            mask = mx.where(mask, 0.0, -math.inf).astype(mx.float32)
        scores = scores + mask
    if sinks is not None:
        p = _softmax_with_sinks(scores, sinks.astype(scores.dtype).reshape(1, kv, rep, 1, 1), cpu)
    elif cpu:
        e = mx.power(math.e, scores - scores.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
    else:
        p = mx.softmax(scores, axis=-1, precise=True)
    p = p.astype(v.dtype).reshape(B, kv, rep * N, T)
    return (p @ v).reshape(B, H, N, v.shape[-1])


def _softmax_with_sinks(scores: mx.array, sink: mx.array, cpu: bool) -> mx.array:
    """softmax over [scores, sink] without the sink's column: exp(s - m) / (sum + exp(sink - m))."""
    def exp(x):
        return mx.power(math.e, x) if cpu else mx.exp(x)

    m = mx.maximum(scores.max(axis=-1, keepdims=True), sink)
    e = exp(scores - m)
    return e / (e.sum(axis=-1, keepdims=True) + exp(sink - m))
