"""Which optional module comes with which extra, and the one-line error a command gives without it.

The core install (``pip install edgespec``) has what the Python API and the generate, bench,
doctor and make-draft commands import; the surfaces with heavier needs import theirs when they
run, and a missing one becomes :class:`MissingExtraError` naming the ``pip install`` that
brings it (``edgespec/cli.py`` turns it into one line and a non-zero exit). The extras
themselves are ``[project.optional-dependencies]`` in ``pyproject.toml``; a test keeps the two in
step.
"""

from __future__ import annotations

from .errors import EdgespecError

EXTRA_OF_MODULE = {  # top-level module -> the extra that installs it
    "fastapi": "serve", "uvicorn": "serve", "starlette": "serve", "prometheus_client": "serve",
    "textual": "chat", "rich": "chat",
    "matplotlib": "plot",
    "mlx_lm": "train",
}


class MissingExtraError(EdgespecError):
    """A command needs a module that only an extra installs."""


def missing_extra(command: str, error: ImportError) -> MissingExtraError | None:
    """The error to show when ``command`` (e.g. "edgespec serve") failed with ``error``: one
    naming the extra when the missing module comes with one, else None (a real failure)."""
    extra = EXTRA_OF_MODULE.get((error.name or "").split(".")[0])
    if extra is None or not isinstance(error, ModuleNotFoundError):  # installed, but broken
        return None
    return MissingExtraError(f"{command} needs the {extra} extra: pip install 'edgespec[{extra}]' "
                             f"(from a checkout: pip install '.[{extra}]')")
