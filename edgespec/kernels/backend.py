"""Which backend runs: the one place the kernels ask.

``on_cpu``: MLX's CPU backend, where the written-out CPU forms of the kernels run.
``use_small_matmul(m, n, k)``: whether ``x @ w.T`` with x (m, k) and w (n, k) runs the native
kernel (``kernels/native``) instead of MLX's matmul (the BLAS). The rule is per shape and
comes from measurements on the dev machine (docs/architecture.md, "Backends"): on the CPU,
with the native module loaded and SIMD code for this CPU (AVX-512 or AVX2), for
``m <= SMALL_M_MAX`` rows and products of at least ``MIN_WORK`` multiply-adds.
``set_native_enabled(False)`` turns the kernels off for this process (A/B measurements;
``EDGESPEC_NATIVE=0`` does the same from the environment). ``choice_key()`` is what the
choice depends on besides the shape: compiled functions that made it while tracing are
cached under it.
"""

from __future__ import annotations

import mlx.core as mx

from ..errors import EdgespecError
from . import native

# Measured against OpenBLAS on every demo-model product (docs/architecture.md): faster at
# 2..32 rows except the smallest products (o_proj 576x576 at 2 rows), even at 64 rows, and at
# 1 row faster only for the big ones (gate|up, the LM head). Below MIN_WORK multiply-adds the
# BLAS's one-thread product is as fast and handing half to a second thread does not pay.
SMALL_M_MAX = 32
MIN_WORK = 1_000_000
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


def choice_key() -> tuple:
    return native_enabled(), SMALL_M_MAX, MIN_WORK


def use_small_matmul(m: int, n: int, k: int) -> bool:
    return 1 <= m <= SMALL_M_MAX and m * n * k >= MIN_WORK and native_enabled()


def use_quantized_small_matmul(m: int, group_size: int, bits: int) -> bool:
    """The quantized kernel (kernels/qmatmul.py) runs with AVX-512 or AVX2 code (on other CPUs
    MLX's product runs). Measured 3-30x faster than MLX's on the demo model's shapes at 1-32
    rows (AVX-512)."""
    return (1 <= m <= SMALL_M_MAX and bits in (4, 8) and group_size in (32, 64, 128)
            and native_enabled())


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
    return (f"active: small_matmul (x @ w.T, 1..{SMALL_M_MAX} rows, >= {MIN_WORK:,} multiply-adds)"
            f", quantized_small_matmul (4/8-bit), {st.reason}")
