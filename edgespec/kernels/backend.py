"""Which backend runs: the one place the kernels ask.

``on_cpu``: MLX's CPU backend, where the written-out CPU forms of the kernels run.
``use_small_matmul(m, n, k)``: whether ``x @ w.T`` with x (m, k) and w (n, k) runs the native
kernel (``kernels/native``) instead of MLX's matmul (the BLAS). The rule is per shape and
comes from measurements on the dev machine (docs/architecture.md, "Backends"): on the CPU,
with the native module loaded and SIMD code for this CPU (AVX-512 or AVX2), for
``m <= SMALL_M_MAX`` rows. ``set_native_enabled(False)`` turns the kernels off for this
process (A/B measurements; ``EDGESPEC_NATIVE=0`` does the same from the environment).
"""

from __future__ import annotations

import mlx.core as mx

from ..errors import EdgespecError
from . import native

# Measured faster than OpenBLAS for every demo-model product at 1 <= m <= 32 rows (at 64 rows
# the two are even and OpenBLAS is the one with more headroom), see docs/architecture.md.
SMALL_M_MAX = 32
SIMD_ISAS = ("avx512", "avx2")

_enabled = [True]


class KernelError(EdgespecError, ValueError):
    """A kernel was given inputs it does not take, or a native kernel that is not there."""


def on_cpu() -> bool:
    """True on MLX's CPU backend, where the written-out CPU forms of the kernels run."""
    return mx.default_device() == mx.cpu


def set_native_enabled(enabled: bool) -> None:
    _enabled[0] = bool(enabled)


def native_enabled() -> bool:
    """Whether the native kernels run here: CPU backend, module loaded, SIMD code, not off."""
    if not (_enabled[0] and on_cpu()):
        return False
    mod = native.load()
    return mod is not None and mod.isa() in SIMD_ISAS


def use_small_matmul(m: int, n: int, k: int) -> bool:
    return 1 <= m <= SMALL_M_MAX and n > 0 and k > 0 and native_enabled()


def native_summary() -> str:
    """One line for ``edgespec doctor``: which native kernels are active, or why not."""
    st = native.status()
    if not st.active:
        return f"inactive: {st.reason}"
    if not _enabled[0]:
        return f"inactive: turned off in this process ({st.reason})"
    if not on_cpu():
        return f"inactive: not on the CPU backend ({mx.default_device()})"
    mod = native.load()
    if mod.isa() not in SIMD_ISAS:
        return f"inactive: no AVX2/AVX-512 on this CPU ({st.reason}); MLX's matmul is faster"
    return f"active: small_matmul (x @ w.T for 1..{SMALL_M_MAX} rows), {st.reason}"
