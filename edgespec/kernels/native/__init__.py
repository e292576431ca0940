"""Loading edgespec's native CPU kernels: the MLX extension built from this folder's C++.

``scripts/setup.sh`` builds it (CMake + nanobind + the system C++ compiler) into ``build/``
here (git-ignored); ``EDGESPEC_NATIVE_DIR`` points elsewhere. ``load()`` imports it once and
returns the module, or None with the reason in ``status()``: turned off
(``EDGESPEC_NATIVE=0``), not built, built from other sources than these (stale: see
``is_stale``), failing to import, or failing its self-check (e.g. built against another MLX
than the one installed).
Every caller then takes the pure-MLX path; the first failure emits ONE
:class:`NativeKernelWarning` that names the reason and the fix, and ``edgespec doctor``
prints the status.

The module's functions: ``small_matmul(x, w)`` (float32 ``x @ w.T``, see
``kernels/matmul.py``), ``isa()`` / ``set_isa(name)`` / ``supported_isas()`` (AVX-512, AVX2 or
generic code, chosen at run time from the CPU) and ``threads()``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import platform
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import mlx.core as mx

from .stamp import SOURCE_SUFFIXES, STAMP_NAME, digest_of

SOURCE_DIR = Path(__file__).resolve().parent
MODULE_NAME = "_edgespec_native"
BUILD_HINT = "run scripts/setup.sh (needs cmake, ninja and nanobind in .venv and a C++ compiler)"


class NativeKernelWarning(RuntimeWarning):
    """The native kernels are not in use; everything runs through the pure-MLX path."""


@dataclass(frozen=True)
class NativeStatus:
    """``active``: the module loaded and passed its self-check. ``reason``: why not, or the
    ISA and threads in use. ``path``: the module file, when one was found."""

    active: bool
    reason: str
    path: str | None = None


_state: dict[str, object] = {}  # "module", "status": the outcome of the one load


def build_dir() -> Path:
    return Path(os.environ.get("EDGESPEC_NATIVE_DIR") or SOURCE_DIR / "build")


def find_module_file(directory: Path) -> Path | None:
    """The built extension module in ``directory`` for this interpreter, if there is one."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = directory / f"{MODULE_NAME}{suffix}"
        if p.is_file():
            return p
    return None


def _newest_source_mtime(sources: Path) -> float:
    return max(p.stat().st_mtime for p in sources.iterdir() if p.suffix in SOURCE_SUFFIXES)


def source_digest() -> str:
    """A digest of the kernels' sources: what a cached measurement of their speed depends on."""
    if "digest" not in _digest:
        _digest["digest"] = digest_of(SOURCE_DIR)
    return _digest["digest"]


def is_stale(module: Path, sources: Path = SOURCE_DIR) -> bool:
    """Whether ``module`` was built from other sources than ``sources``: the digest its build
    stamped beside it (``stamp.py``, written after the module on every build) differs from
    theirs. A stamp older than the module belongs to another build (one whose CMakeLists did
    not stamp, e.g. an older checkout's), so then, as without a stamp, it goes by time: stale
    when older than the newest source. (By time alone, a `git checkout` that restored identical
    sources made the module stale, and every process silently ran the pure-MLX path, ~2.7x
    slower, until a rebuild: stop 30.) ``EDGESPEC_NATIVE_DIR``'s modules are not checked."""
    stamp = module.parent / STAMP_NAME
    if stamp.is_file() and stamp.stat().st_mtime_ns >= module.stat().st_mtime_ns:
        current = source_digest() if sources == SOURCE_DIR else digest_of(sources)
        return stamp.read_text().strip() != current
    return module.stat().st_mtime < _newest_source_mtime(sources)


_digest: dict[str, str] = {}


def _self_check(mod: ModuleType) -> None:
    """Raises unless the module computes x @ w.T on MLX arrays (odd sizes, both tails)."""
    x = mx.arange(3 * 19, dtype=mx.float32).reshape(3, 19) / 7
    w = mx.cos(mx.arange(11 * 19, dtype=mx.float32)).reshape(11, 19)
    y = mod.small_matmul(x, w)
    if not mx.allclose(y, x @ w.T, rtol=1e-5, atol=1e-4).item():
        raise RuntimeError("its x @ w.T differs from MLX's")


def _try_load(directory: Path) -> tuple[ModuleType | None, NativeStatus]:
    if os.environ.get("EDGESPEC_NATIVE", "1") == "0":
        return None, NativeStatus(False, "off (EDGESPEC_NATIVE=0)")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, NativeStatus(False, f"off (no native kernels for {platform.machine()} yet)")
    path = find_module_file(directory)
    if path is None:
        return None, NativeStatus(False, f"not built (no {MODULE_NAME} module in {directory}); "
                                         f"{BUILD_HINT}")
    if directory == SOURCE_DIR / "build" and is_stale(path):
        return None, NativeStatus(False, f"stale (built from other sources than those in "
                                         f"{SOURCE_DIR}); {BUILD_HINT}", str(path))
    try:
        spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if mod.built_for_mlx != mx.__version__:  # before any call: another MLX's array ABI
            raise RuntimeError(f"built for MLX {mod.built_for_mlx}, "
                               f"MLX {mx.__version__} is installed")
        _self_check(mod)
    except Exception as e:  # noqa: BLE001  (any failure means: use the pure-MLX path)
        return None, NativeStatus(False, f"failed to load {path.name}: {type(e).__name__}: {e}; "
                                         f"{BUILD_HINT}", str(path))
    return mod, NativeStatus(True, f"{mod.isa()}, {mod.threads()} threads", str(path))


def load(directory: Path | None = None) -> ModuleType | None:
    """The native module, or None (see ``status()``); loads once per process."""
    if "status" not in _state:
        mod, status = _try_load(directory or build_dir())
        _state["module"], _state["status"] = mod, status
        if mod is None and not status.reason.startswith("off"):  # "off": on purpose or n/a
            warnings.warn(f"edgespec native CPU kernels unavailable, using the pure-MLX path: "
                          f"{status.reason}", NativeKernelWarning, stacklevel=2)
    return _state["module"]


def status() -> NativeStatus:
    load()
    return _state["status"]


def reset() -> None:
    """Forget the outcome of the load (tests: load again with other settings)."""
    _state.clear()
