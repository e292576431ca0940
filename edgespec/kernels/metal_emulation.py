"""Running a Metal kernel body on the CPU: the emulation the tests use where Metal cannot run.

``run(kernel, inputs, ...)`` takes what ``mx.fast.metal_kernel`` takes and returns what it
returns. The body is wrapped in a C++ function whose parameters are the signature MLX would
write (``const device <type>* <input>``, ``device <type>* <output>``, ``<input>_shape`` /
``<input>_ndim`` when the body uses them, template parameters as ``using`` aliases), compiled
with ``g++ -std=c++20 -O1`` against ``kernels_metal/emulation/metal_emu.h`` (threadgroups one
after another, their threads as fibers; barriers, threadgroup memory and SIMD-group operations
as Metal defines them: see the header) into a shared library, cached by the hash of its source
(in ``$EDGESPEC_EMU_CACHE`` or the temp folder), and called with ctypes on numpy copies of the
inputs. Outputs start filled with 0xff bytes, so an element the kernel never writes shows up.

``available()`` says whether a compiler is there (tests skip with its reason when not).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

from .backend import KernelError

_TYPES = {mx.float32: "float", mx.float16: "half", mx.bfloat16: "bfloat16_t", mx.int32: "int",
          mx.uint32: "uint32_t", mx.int64: "int64_t", mx.uint8: "uint8_t", mx.bool_: "bool",
          mx.int16: "int16_t", mx.uint16: "uint16_t"}
_NUMPY = {mx.float32: np.float32, mx.float16: np.float16, mx.bfloat16: np.uint16,
          mx.int32: np.int32, mx.uint32: np.uint32, mx.int64: np.int64, mx.uint8: np.uint8,
          mx.bool_: np.bool_, mx.int16: np.int16, mx.uint16: np.uint16}
_TG_DECL = re.compile(r"^(\s*)threadgroup\s+([\w:<>]+)\s+(\w+)\s*\[([^\]]+)\]\s*;", re.M)
_libs: dict[str, ctypes.CDLL] = {}


def compiler() -> str | None:
    return os.environ.get("CXX") if os.environ.get("CXX") else shutil.which("g++")


def available() -> tuple[bool, str]:
    """(whether kernels can be emulated here, why not / which compiler)."""
    cxx = compiler()
    if cxx is None:
        return False, "no C++ compiler (g++) on PATH to emulate the Metal kernels"
    return True, cxx


def _cache_dir() -> Path:
    d = os.environ.get("EDGESPEC_EMU_CACHE") or os.path.join(
        tempfile.gettempdir(), f"edgespec-metal-emu-{os.getuid()}")
    Path(d).mkdir(parents=True, exist_ok=True)
    return Path(d)


def _numpy(a: mx.array) -> np.ndarray:
    if a.dtype not in _TYPES:
        raise KernelError(f"the emulation takes {', '.join(map(str, _TYPES))}; got {a.dtype}")
    if a.dtype == mx.bfloat16:
        a = a.view(mx.uint16)
    return np.ascontiguousarray(np.array(a))


def translation_unit(kernel, input_dtypes, output_dtypes, template) -> str:
    """The C++ file for one instantiation of ``kernel``'s body."""
    source = kernel.source
    body = _TG_DECL.sub(lambda m: (f"{m[1]}static {m[2]} {m[3]}[{m[4]}]; "
                                   f"static metal_emu::TgRegister<decltype({m[3]})> "
                                   f"{m[3]}_emu_reg({m[3]});"), source)
    params = []
    for name, dt in zip(kernel.input_names, input_dtypes):
        params.append(f"const device {_TYPES[dt]}* {name}")
        if f"{name}_shape" in source:
            params.append(f"const constant int* {name}_shape")
        if f"{name}_ndim" in source:
            params.append(f"const int {name}_ndim")
    params += [f"device {_TYPES[dt]}* {name}" for name, dt in zip(kernel.output_names, output_dtypes)]
    aliases = "".join(f"using {n} = {_TYPES[t]};\n" if not isinstance(t, (int, bool)) else
                      f"constexpr auto {n} = {int(t)};\n" for n, t in template)
    args, b = [], 0
    for name, dt in zip(kernel.input_names, input_dtypes):
        args.append(f"(const {_TYPES[dt]}*)b[{b}]")
        b += 1
        if f"{name}_shape" in source:
            args.append(f"(const int*)b[{b}]")
            b += 1
        if f"{name}_ndim" in source:
            args.append(f"*(const int*)b[{b}]")
            b += 1
    for dt in output_dtypes:
        args.append(f"({_TYPES[dt]}*)b[{b}]")
        b += 1
    return (f'#include "metal_emu.h"\n{kernel.header}\n{aliases}'
            f"static void emu_body({', '.join(params)}) {{\nEMU_IDS\n#line 1 \"{kernel.name}.metal\"\n"
            f"{body}\n}}\n"
            f'extern "C" const char* emu_run(void** b, const unsigned* grid, const unsigned* tg) {{\n'
            f"  static std::string err;\n"
            f"  err = metal_emu::launch(grid, tg, [&] {{ emu_body({', '.join(args)}); }});\n"
            f"  return err.c_str();\n}}\n")


def _library(code: str) -> ctypes.CDLL:
    from .metal import source_dir
    header = source_dir() / "emulation" / "metal_emu.h"
    key = hashlib.sha256((code + header.read_text()).encode()).hexdigest()[:20]
    if key in _libs:
        return _libs[key]
    out = _cache_dir() / f"k_{key}.so"
    if not out.exists():
        ok, cxx = available()
        if not ok:
            raise KernelError(cxx)
        src = _cache_dir() / f"k_{key}_{os.getpid()}.cpp"
        src.write_text(code)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        cmd = [cxx, "-std=c++20", "-O1", "-shared", "-fPIC", "-w", f"-I{header.parent}",
               str(src), "-o", str(tmp)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        src.unlink(missing_ok=True)
        if r.returncode != 0:
            raise KernelError(f"the emulated kernel did not compile:\n{r.stderr[-4000:]}")
        os.replace(tmp, out)
    lib = ctypes.CDLL(str(out))
    lib.emu_run.restype = ctypes.c_char_p
    lib.emu_run.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint),
                            ctypes.POINTER(ctypes.c_uint)]
    _libs[key] = lib
    return lib


def run(kernel, inputs: list[mx.array], *, grid, threadgroup, output_shapes, output_dtypes,
        template=()) -> list[mx.array]:
    """``kernel``'s body run on the CPU; the same arguments and results as the Metal kernel."""
    if len(inputs) != len(kernel.input_names):
        raise KernelError(f"{kernel.name} takes {len(kernel.input_names)} inputs "
                          f"({', '.join(kernel.input_names)}); got {len(inputs)}")
    inputs = [mx.array(x) if not isinstance(x, mx.array) else x for x in inputs]
    code = translation_unit(kernel, [x.dtype for x in inputs], list(output_dtypes), template)
    lib = _library(code)
    source = kernel.source
    keep = []
    for name, x in zip(kernel.input_names, inputs):
        keep.append(_numpy(x))
        if f"{name}_shape" in source:
            keep.append(np.array(x.shape, dtype=np.int32))
        if f"{name}_ndim" in source:
            keep.append(np.array([x.ndim], dtype=np.int32))
    outs = [np.full(int(np.prod(s)) * np.dtype(_NUMPY[dt]).itemsize, 0xff, dtype=np.uint8)
            .view(_NUMPY[dt]).reshape(tuple(s)) for s, dt in zip(output_shapes, output_dtypes)]
    ptrs = (ctypes.c_void_p * (len(keep) + len(outs)))(
        *[a.ctypes.data_as(ctypes.c_void_p) for a in keep + outs])
    g = (ctypes.c_uint * 3)(*grid)
    t = (ctypes.c_uint * 3)(*threadgroup)
    err = lib.emu_run(ptrs, g, t).decode()
    if err:
        raise KernelError(f"emulated kernel {kernel.name} failed: {err}")
    result = []
    for o, dt in zip(outs, output_dtypes):
        a = mx.array(o)
        result.append(a.view(mx.bfloat16) if dt == mx.bfloat16 else a)
    return result
