"""Which backend runs: the one place the kernels ask.

``on_cpu``: MLX's CPU backend, where the written-out CPU forms of the kernels run.
``use_small_matmul(m, n, k)``: whether ``x @ w.T`` with x (m, k) and w (n, k) runs the native
kernel (``kernels/native``) instead of MLX's matmul (the BLAS). The rule is per shape and
comes from measurements on the dev machine (docs/measurements.md, "Small-M products: where the
native kernel takes over"): on the CPU, with the native module loaded and SIMD code for this CPU
(AVX-512 or AVX2), for ``m <= SMALL_M_MAX`` rows and products of at least ``MIN_WORK`` multiply-adds.
``use_q8_activations(bits)``: whether the quantized kernel first rounds x to int8 per 32 values
and multiplies in integers: the default where the kernels run, for 4-bit weights on AVX-512 VNNI
and AVX2 CPUs alike (the same bits on both) and for 8-bit weights on AVX-512, inside forwards
whose blocks all run as native operations (``q8_scope``). ``EDGESPEC_Q8_ACTIVATIONS=0`` or
``set_q8_activations(False)`` keep x in float32, as mlx-lm computes it.
``set_native_enabled(False)`` turns the kernels off for this process (A/B measurements;
``EDGESPEC_NATIVE=0`` does the same from the environment). ``choice_key()`` is what the
choice depends on besides the shape: compiled functions that made it while tracing are
cached under it.
"""

from __future__ import annotations

import contextlib
import contextvars

import mlx.core as mx

from ..errors import EdgespecError
from . import native

# Chosen from measurements against OpenBLAS on every demo-model product with cold weights, as a
# forward reads them (docs/measurements.md, "Small-M products: where the native kernel takes
# over"): the kernel was faster at 1..32 rows for every product of at least MIN_WORK
# multiply-adds. Smaller products (draft heads' and tiny test models') stay on the BLAS: they
# were not measured to gain.
SMALL_M_MAX = 32
MIN_WORK = 100_000
SIMD_ISAS = ("avx512", "avx2")

_enabled = [True]
Q8_ENV = "EDGESPEC_Q8_ACTIVATIONS"
_q8_override: list[bool | None] = [None]  # set_q8_activations' override of Q8_ENV
# False while a forward whose rows are not bit-independent builds its graph (q8_scope)
_q8_rows_exact = contextvars.ContextVar("edgespec_q8_rows_exact", default=True)


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
    return native_enabled(), SMALL_M_MAX, MIN_WORK, q8_activations_requested()


def set_q8_activations(enabled: bool | None) -> None:
    """Override ``EDGESPEC_Q8_ACTIVATIONS`` for this process (None: back to the environment)."""
    _q8_override[0] = None if enabled is None else bool(enabled)


def q8_activations_requested() -> bool:
    """The one place ``EDGESPEC_Q8_ACTIVATIONS`` is read: "1" or unset asks for int8 activations
    in the quantized kernel, "0" keeps x in float32; any other value is an error."""
    if _q8_override[0] is not None:
        return _q8_override[0]
    import os

    value = os.environ.get(Q8_ENV, "1") or "1"
    if value not in ("0", "1"):
        raise KernelError(f"{Q8_ENV}={value!r} is not one of 0, 1")
    return value == "1"


@contextlib.contextmanager
def q8_scope(rows_exact: bool):
    """Int8 activations only where a multi-row forward gives each row the bits it gets alone.

    Rounding x to int8 turns a difference in the last bit of an activation into a different
    int8 value wherever x sits on a rounding boundary, so a forward whose other operations are
    not bit-independent per row (the module path of MoE, hybrid and some attention variants)
    would let a verify of many tokens disagree with one-token decoding. The target's forward
    runs inside this scope with ``rows_exact`` = every block runs as one native operation
    (``Decoder.native_blocks``); outside it int8 activations stay allowed."""
    token = _q8_rows_exact.set(bool(rows_exact))
    try:
        yield
    finally:
        _q8_rows_exact.reset(token)


def use_q8_activations(bits: int) -> bool:
    """Whether the quantized kernel rounds x to int8 per 32 values (kernels/qmatmul.py): asked
    for (the default), 4- or 8-bit weights (8 bits with the VNNI form only), inside a forward whose
    rows are bit-independent (``q8_scope``), and the native module has an int8 form for this
    CPU (AVX-512 VNNI or AVX2; else the float kernel runs)."""
    return _q8_rows_exact.get() and q8_form_runs(bits)


def q8_form_runs(bits: int) -> bool:
    """``use_q8_activations`` outside its scope: whether the int8 form runs for ``bits``-bit
    weights in a forward whose rows are bit-independent."""
    if bits not in (4, 8) or not q8_activations_requested() or not native_enabled():
        return False
    mod = native.load()
    if not getattr(mod, "has_q8_activations", lambda: False)():
        return False
    # AVX2's 8-bit form splits nibbles: slower than float x there (docs/measurements.md,
    # "Int8 activations by default"), whatever ISA the float kernels run
    return bits == 4 or mod.q8_vnni()


def use_native_block_ops() -> bool:
    """Whether the native RMSNorm and q|k|v + RoPE ops run (``kernels/rope_norm.py``)."""
    return native_enabled()


def use_native_block() -> bool:
    """Whether a float decoder block of a small forward runs as one native operation
    (``fused_block.FusedBlock``, ``native/block.h``): the native ops, and no Metal kernel (or
    its emulation) asked to run the tree attention."""
    return native_enabled() and metal_kernels() == "off"


def prefill_chunk(native_blocks: bool) -> int:
    """Tokens a prefill scores at a time (``engine.py``). Where every block of the model runs
    small forwards as one native operation (``native_blocks``: ``Decoder.native_blocks``) and
    the native block is in use (the CPU), ``SMALL_M_MAX``: each chunk then goes through it (the
    chunk's products on the native kernels, its attention on the tree attention) instead of
    MLX's ops and BLAS (docs/measurements.md, "The prefill in chunks of 32 tokens"). Otherwise
    512 (models whose blocks have no native form, e.g. MoE ones, were not measured with smaller
    chunks)."""
    return SMALL_M_MAX if native_blocks and on_cpu() and use_native_block() else 512


def use_small_matmul(m: int, n: int, k: int, exact: bool = False) -> bool:
    """Whether an (m, k) x (k, n) float32 product runs the native kernel: 1..SMALL_M_MAX rows
    and, unless ``exact``, at least ``MIN_WORK`` multiply-adds (below that MLX's is as fast).
    ``exact``: whatever the work, so that 1 row and 9 of the same product take the same kernel,
    whose rows do not depend on each other (a small router's one row would otherwise take the
    BLAS and a verify's rows the kernel)."""
    return 1 <= m <= SMALL_M_MAX and (exact or m * n * k >= MIN_WORK) and native_enabled()


def use_quantized_small_matmul(m: int, group_size: int, bits: int) -> bool:
    """The quantized kernel (kernels/qmatmul.py) runs with AVX-512 or AVX2 code (on other CPUs
    MLX's product runs), at any number of rows, prefills included: MLX's CPU product costs about
    M times its one-row time (docs/measurements.md, "Small-M products: where the native kernel
    takes over", its quantized part)."""
    return m >= 1 and bits in (4, 8) and group_size in (32, 64, 128) and native_enabled()


def use_native_tree_attention() -> bool:
    """Whether tree/chain forwards of at most 64 tokens attend through the native kernel
    (``kernels/tree_attention.py``) on this CPU: one operation per layer instead of the
    written-out softmax's eight, each launched by MLX on its own (docs/measurements.md, "Figures
    that stood in docstrings")."""
    return native_enabled() and hasattr(native.load(), "tree_attention")


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
    q8 = (f"off ({Q8_ENV}=0): float x" if not q8_activations_requested() else
          "on: x rounded to int8 per 32 values" if use_q8_activations(4) else
          "asked but no int8 form for this CPU: float x")
    unpack = ("once for all rows" if mod.buffered_dequantization() else "per 4 rows")
    if not use_q8_activations(4):  # the int8 form has no float-kernel path
        unpack += f", from {mod.dequantized_gemm_rows()} rows once a chunk for the float kernel"
    return (f"active: small_matmul (x @ w.T, 1..{SMALL_M_MAX} rows, >= {MIN_WORK:,} multiply-adds)"
            f", quantized_small_matmul (4/8-bit; int8 activations {q8}; weights unpacked {unpack}),"
            f" tree_attention (<= 64 nodes), rms_norm, "
            f"qkv_rope, decoder_block (float or 4/8-bit, <= {SMALL_M_MAX} tokens; also the "
            f"EAGLE-3 head's layer), {st.reason}")


# ---- the Metal kernels (kernels_metal/: tree attention, acceptance, KV compaction) -------------
METAL_MODES = ("auto", "emulate", "off")
_metal_mode: list[str | None] = [None]  # set_metal_kernels' override of EDGESPEC_METAL_KERNELS


def set_metal_kernels(mode: str | None) -> None:
    """Override ``EDGESPEC_METAL_KERNELS`` for this process (None: back to the environment)."""
    if mode is not None and mode not in METAL_MODES:
        raise KernelError(f"Metal kernel mode {mode!r} is not one of {', '.join(METAL_MODES)}")
    _metal_mode[0] = mode


def metal_mode() -> str:
    """The requested mode: the override, else ``EDGESPEC_METAL_KERNELS``, else ``auto``."""
    import os

    mode = _metal_mode[0] or os.environ.get("EDGESPEC_METAL_KERNELS", "auto") or "auto"
    if mode not in METAL_MODES:
        raise KernelError(f"EDGESPEC_METAL_KERNELS={mode!r} is not one of {', '.join(METAL_MODES)}")
    return mode


def metal_available() -> bool:
    return mx.metal.is_available() and mx.default_device() == mx.gpu


def metal_kernels() -> str:
    """Which implementation of the tree-verification ops runs: ``metal`` (auto on a Mac's GPU),
    ``emulate`` (the kernels' source on the CPU, requested), or ``off`` (the pure-MLX twins and
    the engine's dense-mask path, unchanged)."""
    mode = metal_mode()
    if mode == "emulate":
        return "emulate"
    if mode == "auto" and metal_available():
        return "metal"
    return "off"


def metal_summary() -> str:
    """One line for ``edgespec doctor``: which Metal kernels are active here, and why."""
    names = "tree_attention, accept_greedy, accept_sampling, compact_kv"
    mode, active = metal_mode(), metal_kernels()
    if active == "metal":
        return f"active ({names}) on {mx.default_device()}"
    if active == "emulate":
        return f"emulated on the CPU ({names}; EDGESPEC_METAL_KERNELS=emulate: slow, for tests)"
    if mode == "off":
        return "off (EDGESPEC_METAL_KERNELS=off): the pure-MLX twins run"
    if mx.metal.is_available():
        return f"off (Metal is there but the default device is {mx.default_device()})"
    return "off (no Metal device; the kernels' source is emulated in the tests)"
