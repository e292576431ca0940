"""Print what scripts/setup.sh installs into .venv before edgespec's editable install, which
builds without pip's build isolation: pyproject.toml's [build-system].requires, one a line, with
MLX taken from the install's own choice (the extra named by argv[1], cpu or cuda; else the core
dependencies' MLX, as on macOS) instead of the build's mlx[cpu], so a CUDA
venv does not get the CPU package too."""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip's own copy of the same parser
    from pip._vendor import tomli as tomllib


def is_mlx(req: str) -> bool:
    return req.split(";")[0].split("[")[0].split(">")[0].split("=")[0].strip() == "mlx"


def main(backend: str) -> list[str]:
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    build = [r for r in project["build-system"]["requires"] if not is_mlx(r)]
    extras = project["project"]["optional-dependencies"]
    chosen = extras[backend] if backend in ("cpu", "cuda") else project["project"]["dependencies"]
    mlx = [r for r in chosen if is_mlx(r)]
    return build + mlx


if __name__ == "__main__":
    print("\n".join(main(sys.argv[1] if len(sys.argv) > 1 else "")))
