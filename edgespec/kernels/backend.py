"""Which backend runs: the one place the kernels ask."""

from __future__ import annotations

import mlx.core as mx


def on_cpu() -> bool:
    """True on MLX's CPU backend, where the written-out CPU forms of the kernels run."""
    return mx.default_device() == mx.cpu
