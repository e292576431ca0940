"""The Metal kernels' sources (``kernels_metal/``) and one callable per kernel, built lazily.

``kernel(name)`` returns the :class:`MetalKernel` for ``kernels_metal/<name>.metal`` (a kernel
*body*, as ``mx.fast.metal_kernel`` takes it, with ``common.h`` as its header). Calling it with
``mode="metal"`` runs the real kernel (built once per process with ``mx.fast.metal_kernel``;
only where ``mx.metal.is_available()``), with ``mode="emulate"`` the same body compiled with the
system C++ compiler under ``kernels_metal/emulation/metal_emu.h`` (``metal_emulation.py``: slow,
for tests and for running the engine's kernel path on machines without Metal). Both take and
return the same arrays, so each op (``tree_attention.py``, ``accept.py``, ``compact.py``) builds
one call and the backend chooses where it runs (``backend.metal_kernels``).

The sources live at the repository root (``kernels_metal/``); a wheel carries them as
``edgespec/kernels_metal`` (``wheel.packages`` in ``pyproject.toml``). ``source_dir()`` looks in the
installed package first, then at the root of the checkout this package runs from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

from .backend import KernelError

_HERE = Path(__file__).resolve().parent
SOURCE_DIRS = (_HERE.parent / "kernels_metal", _HERE.parent.parent / "kernels_metal")


def source_dir() -> Path:
    """The folder holding the kernel bodies (installed copy first, then the checkout's)."""
    for d in SOURCE_DIRS:
        if (d / "common.h").is_file():
            return d
    raise KernelError(f"the Metal kernel sources are missing: looked in "
                      f"{', '.join(str(d) for d in SOURCE_DIRS)}")


@dataclass
class MetalKernel:
    """One kernel: ``kernels_metal/<name>.metal``, or the body ``text`` when given (tests)."""

    name: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    text: str | None = None
    _built: object = field(default=None, repr=False)

    @property
    def source(self) -> str:
        return self.text if self.text is not None else (source_dir() / f"{self.name}.metal").read_text()

    @property
    def header(self) -> str:
        return (source_dir() / "common.h").read_text()

    def __call__(self, mode: str, inputs: list[mx.array], *, grid: tuple[int, int, int],
                 threadgroup: tuple[int, int, int], output_shapes: list[tuple[int, ...]],
                 output_dtypes: list, template: list[tuple[str, object]] = ()) -> list[mx.array]:
        if mode == "metal":
            if self._built is None:
                self._built = mx.fast.metal_kernel(
                    name=f"edgespec_{self.name}", input_names=list(self.input_names),
                    output_names=list(self.output_names), source=self.source, header=self.header)
            return self._built(inputs=inputs, template=list(template), grid=grid,
                               threadgroup=threadgroup, output_shapes=output_shapes,
                               output_dtypes=output_dtypes)
        if mode == "emulate":
            from . import metal_emulation
            return metal_emulation.run(self, inputs, template=list(template), grid=grid,
                                       threadgroup=threadgroup, output_shapes=output_shapes,
                                       output_dtypes=output_dtypes)
        raise KernelError(f"a Metal kernel runs in mode 'metal' or 'emulate', not {mode!r}")


KERNELS = {
    "tree_attention": MetalKernel("tree_attention", ("q", "k", "v", "anc", "qpos", "ip", "fp"),
                                  ("out",)),
    "accept_greedy": MetalKernel("accept_greedy", ("argmax", "parents", "tokens", "ip"),
                                 ("path", "info")),
    "accept_sampling": MetalKernel("accept_sampling",
                                   ("p", "q", "tokens", "parents", "uniforms", "ip"),
                                   ("path", "info", "resid")),
    "compact_kv": MetalKernel("compact_kv", ("keys", "values", "rows", "ip"), ("kout", "vout")),
}


def kernel(name: str) -> MetalKernel:
    if name not in KERNELS:
        raise KernelError(f"no Metal kernel {name!r}; there are {', '.join(KERNELS)}")
    return KERNELS[name]
