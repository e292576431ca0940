"""GGUF file -> edgespec model directory, written atomically (tensors from ``tensors.py``, the
tokenizer from ``tokenizer.py``): everything goes into a private sibling directory, weights
files of about ``SHARD_BYTES`` written as the tensors are decoded, which is renamed into place
when complete, so an interrupted conversion never leaves a half-written model directory."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import mlx.core as mx

from ...errors import ModelLoadError
from .tensors import _check_supported, convert_tensors, hf_config, read_metadata
from .tokenizer import tokenizer_files


SHARD_BYTES = 2 << 30
"""Converted arrays written to a weights file at a time: the conversion holds at most about this
much besides the tensor being decoded, where holding every tensor until one write held the
whole model (docs/measurements.md, "The conversion's memory")."""


class _Shards:
    """Weights files written as the arrays come (``add``), each about ``SHARD_BYTES``, into the
    partial directory: ``model.safetensors`` when there is one, else Hugging Face's
    ``model-0000i-of-0000n.safetensors`` (``targets/load.py`` reads every ``*.safetensors``)."""

    def __init__(self, folder: Path, limit: int):
        self.folder, self.limit = folder, limit
        self.pending: dict[str, mx.array] = {}
        self.size, self.written = 0, []

    def add(self, name: str, array: mx.array) -> None:
        self.pending[name] = array
        self.size += array.nbytes
        if self.size >= self.limit:
            self._flush()

    def _flush(self) -> None:
        if not self.pending and self.written:
            return
        f = self.folder / f"shard-{len(self.written):05d}.safetensors"
        try:
            mx.save_safetensors(str(f), self.pending, metadata={"format": "mlx"})
        except RuntimeError as e:  # MLX's way of saying the file could not be written
            raise OSError(str(e)) from e
        self.written.append(f)
        self.pending, self.size = {}, 0
        mx.clear_cache()  # the written arrays' memory back to the system, not MLX's cache

    def close(self) -> None:
        self._flush()
        n = len(self.written)
        for i, f in enumerate(self.written, 1):
            f.rename(self.folder / ("model.safetensors" if n == 1
                                    else f"model-{i:05d}-of-{n:05d}.safetensors"))


def _partial_dir(out: Path) -> Path:
    """A private temporary sibling of ``out``, renamed into place when complete."""
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))


def _finish(tmp: Path, out: Path, files: dict[str, object]) -> None:
    """Write the text files into ``tmp`` and rename it to ``out``."""
    for name, content in files.items():
        text = content if isinstance(content, str) else json.dumps(content, indent=2,
                                                                    ensure_ascii=False)
        (tmp / name).write_text(text, encoding="utf-8")
    tmp.chmod(0o755)  # mkdtemp makes it private; a model directory is ordinary data
    if out.is_dir():
        out.rmdir()  # empty (checked by the caller); a rename cannot replace a directory
    os.rename(tmp, out)


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, *, progress: bool = True) -> Path:
    """Convert the GGUF file ``gguf_path`` (an architecture in ``archs.py``) into the new model
    directory ``out_dir``.

    ``out_dir`` must not exist or be empty. Returns ``out_dir``. See the module docstring for the
    tensor types, the quantization config and the errors raised.
    """
    path, out = Path(gguf_path).expanduser(), Path(out_dir).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"no such GGUF file: {path}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelLoadError(f"output directory {out} already exists and is not empty; "
                             "remove it or choose another")
    reader, meta = read_metadata(path)
    _check_supported(reader, meta, path)
    config = hf_config(meta, {t.name for t in reader.tensors}, path)
    files = tokenizer_files(meta, path)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp = _partial_dir(out)
    except OSError as e:
        raise ModelLoadError(f"cannot write the model directory {out}: {e}") from e
    try:
        shards = _Shards(tmp, SHARD_BYTES)
        _, quantization = convert_tensors(reader, config, path, progress, sink=shards.add)
        shards.close()
        if quantization:
            config["quantization"] = quantization
        _finish(tmp, out, {"config.json": config, **files})
    except OSError as e:  # disk full, or another process created ``out`` first
        raise ModelLoadError(f"cannot write the model directory {out}: {e}") from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
