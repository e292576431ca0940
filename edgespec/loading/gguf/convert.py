"""GGUF file -> edgespec model directory, written atomically (tensors from ``tensors.py``, the
tokenizer from ``tokenizer.py``)."""

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


def _write_atomically(out: Path, weights: dict, files: dict[str, object]) -> None:
    """Write into a temporary sibling of ``out`` and rename it into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        for name, content in files.items():
            text = content if isinstance(content, str) else json.dumps(content, indent=2,
                                                                        ensure_ascii=False)
            (tmp / name).write_text(text, encoding="utf-8")
        tmp.chmod(0o755)  # mkdtemp makes it private; a model directory is ordinary data
        if out.is_dir():
            out.rmdir()  # empty (checked by the caller); a rename cannot replace a directory
        os.rename(tmp, out)
    except OSError as e:  # disk full, or another process created ``out`` first
        raise ModelLoadError(f"cannot write the model directory {out}: {e}") from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


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
    weights, quantization = convert_tensors(reader, config, path, progress)
    if quantization:
        config["quantization"] = quantization
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(out, weights, {"config.json": config, **files})
    return out
