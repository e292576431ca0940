"""Put an optimized BLAS under MLX's CPU matmuls on Linux.

Contract: ``load_optimized_blas()`` must run before anything imports ``mlx`` (``edgespec/__init__``
calls it first). On Linux it dlopens MKL or OpenBLAS with ``RTLD_GLOBAL``. The ``mlx[cpu]`` wheel
links a bundled reference BLAS, but the loader resolves ``libmlx.so``'s ``cblas_sgemm`` in the global
scope first, so a global library loaded *before* mlx wins; loaded after, it has no effect (Python
dlopens extensions ``RTLD_NOW``: the slot is bound at import). On macOS it does nothing (Accelerate).
``EDGESPEC_BLAS`` = ``off`` | ``mkl`` | ``openblas`` | a library path; an explicit choice that cannot
be loaded raises :class:`ConfigError`. ``blas_info()`` reports what libmlx's own GOT slot for
``cblas_sgemm`` points into (ground truth, checked against timings), not a guess.

Default order (``default_order``): MKL (pip ``mkl``, in ``sys.prefix/lib``) first, then the
system's OpenBLAS (``libopenblas0-pthread``); on AMD CPUs OpenBLAS first. Both beat MLX's reference
BLAS by a wide margin on every product a forward makes; MKL was the faster of the two on the Intel
dev VM, OpenBLAS on the AMD one (docs/measurements.md, "OpenBLAS against MKL", and "Figures that
stood in docstrings" for the Intel per-product figures). The threads are left to the libraries
(``MKL_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS``): their default matched the best setting there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import struct
import sys
from dataclasses import dataclass

from ..errors import ConfigError

CHOICES = ("off", "mkl", "openblas")


@dataclass(frozen=True)
class BlasInfo:
    """Which BLAS serves MLX's float32 matmuls in this process."""

    name: str  # "mkl" | "openblas" | "custom" | "reference" | "accelerate"
    path: str | None  # the library we loaded, if any
    # "active" | "inactive" (libmlx is bound elsewhere) | "loaded before mlx" | "loaded after mlx"
    # (mlx not mapped yet, so unverified) | "reference" | "n/a (macOS)"
    status: str
    provider: str | None  # library that libmlx's cblas_sgemm resolves to (None: mlx not loaded yet)
    detail: str = ""


_loaded: BlasInfo | None = None


def _candidates(name: str) -> list[str]:
    if name == "mkl":
        return sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")), reverse=True)
    paths = glob.glob("/usr/lib/*-linux-gnu/libopenblas.so.0") + glob.glob("/usr/lib64/libopenblas.so.0")
    found = ctypes.util.find_library("openblas") if not paths else None
    return paths + ([found] if found else [])


def load_optimized_blas() -> BlasInfo:
    """Load the first optimized BLAS found (``EDGESPEC_BLAS`` decides); idempotent."""
    global _loaded
    if _loaded is None:
        _loaded = _load(os.environ.get("EDGESPEC_BLAS", "").strip())
    return _loaded


def _load(choice: str) -> BlasInfo:
    if sys.platform == "darwin":
        return BlasInfo("accelerate", None, "n/a (macOS)", None, "MLX uses Accelerate / Metal")
    if choice.lower() == "off" or not sys.platform.startswith("linux"):
        return BlasInfo("reference", None, "reference", None, f"EDGESPEC_BLAS={choice or 'unset'}")
    if choice and choice.lower() not in CHOICES and "/" not in choice and ".so" not in choice:
        raise ConfigError(f"EDGESPEC_BLAS={choice!r} is not one of {CHOICES} or a library path")
    order = [choice.lower()] if choice.lower() in CHOICES else ["custom"] if choice else default_order()
    before, errors = "mlx.core" not in sys.modules, []
    for name in order:
        if name == "mkl":
            quiet_openmp_threads()
        for path in [choice] if name == "custom" else _candidates(name):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                errors.append(str(e))
                continue
            late = "" if before else "mlx.core was imported first: likely no effect"
            return BlasInfo(name, path, "loaded after mlx" if late else "loaded before mlx", None, late)
    if choice:
        raise ConfigError(f"EDGESPEC_BLAS={choice!r} but nothing could be loaded ({errors or 'not found'});"
                          " pip install mkl, apt-get install libopenblas0-pthread, or set EDGESPEC_BLAS=off")
    return BlasInfo("reference", None, "reference", None, "no MKL or OpenBLAS found; run scripts/setup.sh")


def quiet_openmp_threads() -> None:
    """MKL's OpenMP threads sleep as soon as a product ends (``KMP_BLOCKTIME=0``, unless set).

    By default they spin for 200 ms after each MKL call, and on a small machine that takes a core
    from the native kernels' second thread: methods whose drafting runs MKL products every step
    (a Medusa head's) lost much of their speed to it, while plain decoding, which calls MKL only
    for prefills, did not (docs/measurements.md, "MKL's OpenMP threads").
    Intel's OpenMP reads the variable when it starts, so it is set before MKL is loaded."""
    global _quieted
    if "KMP_BLOCKTIME" not in os.environ:
        os.environ["KMP_BLOCKTIME"] = "0"
        _quieted = True


_quieted = False  # whether KMP_BLOCKTIME=0 is edgespec's setting (not the user's)


def busy_openmp_threads() -> None:
    """Give MKL's OpenMP threads back their default 200 ms of spinning, for work that is all
    MKL products and never runs the native kernels' pool: ``edgespec train``'s batched
    generation, teacher forcing and training steps. There, sleeping after every call costs far
    more than it saves (docs/measurements.md, "Figures that stood in docstrings"). Only
    edgespec's own setting is undone, and only before OpenMP has started
    (it reads the variable once): call this before the first MKL product."""
    global _quieted
    if _quieted and os.environ.get("KMP_BLOCKTIME") == "0":
        os.environ["KMP_BLOCKTIME"] = "200"
        _quieted = False


def default_order(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """MKL first, but OpenBLAS first on AMD CPUs (measured: see the module docstring)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            amd = "AuthenticAMD" in f.read(4096)
    except OSError:
        amd = False
    return ["openblas", "mkl"] if amd else ["mkl", "openblas"]


class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]


def _library_of(addr: int | None) -> str | None:
    info, dladdr = _DlInfo(), ctypes.CDLL(None).dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    return os.path.realpath(info.fname.decode()) if addr and dladdr(addr, ctypes.byref(info)) else None


@functools.lru_cache(maxsize=4)
def _got_offset(path: str, symbol: bytes) -> int | None:
    """Offset of ``symbol``'s relocated slot (JUMP_SLOT / GLOB_DAT) in an ELF64 little-endian .so."""
    with open(path, "rb") as f:
        elf = f.read()
    shoff, shentsize, shnum = struct.unpack_from("<Q10xHH", elf, 0x28)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    for _, sh_type, _, _, off, size, link, _, _, _ in sections:
        if sh_type != 4 or link == 0:  # SHT_RELA; its sh_link is .dynsym, whose sh_link is .dynstr
            continue
        symtab, strtab = sections[link][4], sections[sections[link][6]][4]
        for r_offset, r_info, _ in struct.iter_unpack("<QQq", elf[off:off + size]):
            name_at = strtab + struct.unpack_from("<I", elf, symtab + (r_info >> 32) * 24)[0]
            if elf[name_at:elf.index(b"\0", name_at)] == symbol:
                return r_offset
    return None


def _mlx_sgemm_provider() -> str | None:
    """The library libmlx's cblas_sgemm slot points into; None if libmlx is not mapped."""
    with open("/proc/self/maps") as f:
        maps = [m for m in (line.split() for line in f) if len(m) == 6]
    libmlx = next((m[5] for m in maps if os.path.basename(m[5]).startswith("libmlx.")), None)
    if libmlx is None or (offset := _got_offset(libmlx, b"cblas_sgemm")) is None:
        return None
    base = min(int(m[0].split("-")[0], 16) for m in maps if m[5] == libmlx and int(m[2], 16) == 0)
    provider = _library_of(ctypes.c_void_p.from_address(base + offset).value)
    if provider == os.path.realpath(libmlx):  # still the lazy PLT stub: binding searches globals first
        provider = _library_of(_symbol_address(ctypes.CDLL(None)))
    return provider or "bundled reference BLAS"


def _symbol_address(lib: ctypes.CDLL, symbol: str = "cblas_sgemm") -> int | None:
    return ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value if hasattr(lib, symbol) else None


def blas_info() -> BlasInfo:
    """What serves MLX's float32 matmuls now; ``status`` is "active" only if libmlx is bound to ours."""
    info = load_optimized_blas()
    provider = _mlx_sgemm_provider() if sys.platform.startswith("linux") else None
    if provider is None or info.path is None:
        return BlasInfo(info.name, info.path, info.status, provider, info.detail)
    ours = provider == _library_of(_symbol_address(ctypes.CDLL(info.path, mode=ctypes.RTLD_GLOBAL)))
    return BlasInfo(info.name, info.path, "active" if ours else "inactive", provider, info.detail)
