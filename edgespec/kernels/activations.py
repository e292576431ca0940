"""SiLU and log-sum-exp, per backend: MLX's own ops on GPUs; on the CPU written out with
``mx.power`` (see ``attention.py`` for why MLX's CPU ``exp``/``sigmoid`` are avoided)."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from .backend import on_cpu


def silu(x: mx.array) -> mx.array:
    if not on_cpu():
        return nn.silu(x)
    return x / (1 + mx.power(math.e, -x))


def logsumexp(x: mx.array) -> mx.array:
    """log(sum(exp(x))) over the last axis, keeping it: (..., 1)."""
    if not on_cpu():
        return mx.logsumexp(x, axis=-1, keepdims=True)
    m = x.max(axis=-1, keepdims=True)
    return m + mx.log(mx.power(math.e, x - m).sum(axis=-1, keepdims=True))
