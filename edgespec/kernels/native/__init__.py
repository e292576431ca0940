"""Loading edgespec's native CPU kernels: the MLX extension built from this folder's C++.

The build backend (scikit-build-core, ``pyproject.toml``) builds it with CMake, nanobind and the
system C++ compiler. In a checkout it is loaded from ``build/`` here (the editable install of
``scripts/setup.sh`` builds there, git-ignored); installed from a wheel (``pip install .``),
from this folder itself; ``EDGESPEC_NATIVE_DIR`` names another folder. Each build leaves the
digest of the sources it compiled beside the module (``stamp.py``), and a wheel carries this
folder's sources too, so in both places the module is checked against the sources beside it.

``load()`` imports it once and returns the module, or None with the reason in ``status()``:
turned off (``EDGESPEC_NATIVE=0``), not built, built from other sources than these (stale: see
``is_stale``), failing to import, or failing its self-check (e.g. built against another MLX
than the one installed). Every caller then takes the pure-MLX path; the first failure emits ONE
:class:`NativeKernelWarning` that names the reason and the fix, and ``edgespec doctor`` prints
the status.

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


def in_checkout() -> bool:
    """Whether this package runs from a source checkout (editable install, or the repo root on
    sys.path) rather than from an installed wheel."""
    return (SOURCE_DIR.parents[2] / "scripts" / "setup.sh").is_file()


def build_hint() -> str:
    """How to get the module built, for the place this package runs from."""
    if in_checkout():
        return "run scripts/setup.sh (it builds them with the C++ compiler it finds, or $CXX)"
    return ("reinstall edgespec with a C++ compiler on PATH (or $CXX); "
            "`pip install -v` shows the build's log")


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
    """The folder the module is loaded from: ``EDGESPEC_NATIVE_DIR`` when set; in a checkout,
    ``build/`` here; installed, this folder."""
    override = os.environ.get("EDGESPEC_NATIVE_DIR")
    if override:
        return Path(override)
    return SOURCE_DIR / "build" if in_checkout() else SOURCE_DIR


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


def is_stale(module: Path, sources: Path = SOURCE_DIR, *, by_time: bool = True) -> bool:
    """Whether ``module`` was built from other sources than ``sources``: the digest its build
    stamped beside it (``stamp.py``, written after the module on every build) differs from
    theirs. A stamp older than the module belongs to another build (one whose CMakeLists did
    not stamp, e.g. an older checkout's), so then, as without a stamp, it goes by time: stale
    when older than the newest source (only by bytes, not by time, does a `git checkout` that
    restores identical sources keep the module). ``by_time=False`` (an installed wheel, whose
    files all get the time of the install) trusts the stamp alone: stale without one.
    ``EDGESPEC_NATIVE_DIR``'s modules are not checked."""
    stamp = module.parent / STAMP_NAME
    if stamp.is_file() and (not by_time or stamp.stat().st_mtime_ns >= module.stat().st_mtime_ns):
        current = source_digest() if sources == SOURCE_DIR else digest_of(sources)
        return stamp.read_text().strip() != current
    if not by_time:
        return True
    return module.stat().st_mtime < _newest_source_mtime(sources)


_digest: dict[str, str] = {}


def _self_check(mod: ModuleType) -> None:
    """Raises unless the module computes x @ w.T on MLX arrays (odd sizes, both tails)."""
    x = mx.arange(3 * 19, dtype=mx.float32).reshape(3, 19) / 7
    w = mx.cos(mx.arange(11 * 19, dtype=mx.float32)).reshape(11, 19)
    y = mod.small_matmul(x, w)
    if not mx.allclose(y, x @ w.T, rtol=1e-5, atol=1e-4).item():
        raise RuntimeError("its x @ w.T differs from MLX's")


# Each module file imported in this process: importing one again (after ``reset``) would run
# its initialisation twice, and nanobind registers a class (DecoderStack) once per process.
_imported: dict[str, ModuleType] = {}


def _try_load(directory: Path) -> tuple[ModuleType | None, NativeStatus]:
    if os.environ.get("EDGESPEC_NATIVE", "1") == "0":
        return None, NativeStatus(False, "off (EDGESPEC_NATIVE=0)")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, NativeStatus(False, f"off (no native kernels for {platform.machine()} yet)")
    path = find_module_file(directory)
    if path is None:
        return None, NativeStatus(False, f"not built (no {MODULE_NAME} module in {directory}); "
                                         f"{build_hint()}")
    if directory in (SOURCE_DIR / "build", SOURCE_DIR) and is_stale(
            path, by_time=directory != SOURCE_DIR):
        return None, NativeStatus(False, f"stale (built from other sources than those in "
                                         f"{SOURCE_DIR}); {build_hint()}", str(path))
    try:
        mod = _imported.get(str(path))
        if mod is None:
            spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            _imported[str(path)] = mod
        if mod.built_for_mlx != mx.__version__:  # before any call: another MLX's array ABI
            raise RuntimeError(f"built for MLX {mod.built_for_mlx}, "
                               f"MLX {mx.__version__} is installed")
        _self_check(mod)
    except Exception as e:  # noqa: BLE001  (any failure means: use the pure-MLX path)
        return None, NativeStatus(False, f"failed to load {path.name}: {type(e).__name__}: {e}; "
                                         f"{build_hint()}", str(path))
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
