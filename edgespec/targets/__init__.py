"""Targets: loading a model reference into something the engine can score trees with."""

from __future__ import annotations

from .load import load_target
from .target import Target, TargetOutput


def load(ref: str, dtype: str | None = None, progress: bool = True) -> Target:
    """Load a model: a Hugging Face repo id, a local model directory, a .gguf file, or "demo"."""
    from ..loading.hub import resolve_model

    return load_target(resolve_model(ref, progress=progress), dtype=dtype)


__all__ = ["Target", "TargetOutput", "load", "load_target"]
