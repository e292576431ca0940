"""SiLU, per backend: ``nn.silu`` on GPUs; on the CPU written out with ``mx.power`` (see
``attention.py`` for why MLX's CPU ``exp``/``sigmoid`` are avoided)."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from .backend import on_cpu


def silu(x: mx.array) -> mx.array:
    if not on_cpu():
        return nn.silu(x)
    return x / (1 + mx.power(math.e, -x))
