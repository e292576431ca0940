"""Shared fixtures: the tiny random models of ``tiny.py``, each built and loaded once per session.

- ``tiny_models``: the session's cache. ``tiny_models.path(**options)`` is a model directory
  (for the CLI, the server, the chat), ``tiny_models.load(**options)`` a loaded float32 Target;
  the options are ``make_tiny_model``'s, and equal options give the same directory / object.
- ``target``: a loaded tiny model (2-layer llama). A test module that sets ``TARGET_KINDS``
  (names from ``tiny.KINDS``: plain llama, sliding window, attention bias) gets each of its
  tests that take ``target`` once per kind, with ``TARGET_LAYERS`` layers if it sets that.
- ``other``: a low-scale model with another seed, a draft model that disagrees with the other
  tiny models (its drafts get rejected).

Tied tiny models put nearly all probability on repeating the last token; a test that needs a
spread-out distribution under sampling uses ``tie=False`` (see test_lossless.py).

Loaded targets are shared between modules: a test may monkeypatch one (undone after the test)
but must not change its weights; a test that does loads its own copy.
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import pytest

from .tiny import KINDS, make_tiny_model

# Tree sizes here must not depend on how long a verify took (targets/cost.observing); the
# tests of that learning turn it on for themselves.
os.environ.setdefault("EDGESPEC_OBSERVED_COSTS", "0")


class TinyModels:
    def __init__(self, root: Path):
        self.root = root
        self._paths: dict[tuple, Path] = {}
        self._loaded: dict[tuple, object] = {}

    @staticmethod
    def _key(options: dict) -> tuple:
        """The options that differ from make_tiny_model's defaults (so equal models share one)."""
        defaults = {k: p.default for k, p in inspect.signature(make_tiny_model).parameters.items()}
        return tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                            for k, v in options.items() if defaults[k] != v))

    def path(self, **options) -> Path:
        key = self._key(options)
        if key not in self._paths:
            name = re.sub(r"[^\w.=-]+", "_", "-".join(f"{k}={v}" for k, v in key)) or "default"
            self._paths[key] = make_tiny_model(self.root / name, **options)
        return self._paths[key]

    def load(self, **options):
        from edgespec.targets import load_target

        key = self._key(options)
        if key not in self._loaded:
            self._loaded[key] = load_target(self.path(**options), dtype="float32")
        return self._loaded[key]


@pytest.fixture(autouse=True)
def auto_keeps_its_eagle3_arm(monkeypatch):
    """``auto`` leaves out its EAGLE-3 arm where the measured verify-cost curve is steep
    (``registry._steep``); a tiny model's curve is timing, so tests see a flat one unless they
    test the rule itself (tests/test_auto.py)."""
    from edgespec.drafters import registry

    monkeypatch.setattr(registry, "_steep", lambda target: False)


@pytest.fixture(scope="session", autouse=True)
def no_learning_from_tests(tmp_path_factory):
    """Tests neither record for learning (``EDGESPEC_LEARN=0``) nor read or write the user's
    learned heads (``EDGESPEC_LEARN_DIR`` in a temporary folder); the learning tests turn
    recording on themselves."""
    saved = {k: os.environ.get(k) for k in ("EDGESPEC_LEARN", "EDGESPEC_LEARN_DIR")}
    os.environ["EDGESPEC_LEARN"] = "0"
    os.environ["EDGESPEC_LEARN_DIR"] = str(tmp_path_factory.mktemp("learn"))
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def float_activations(monkeypatch):
    """The quantized kernels keep x in float32 (``EDGESPEC_Q8_ACTIVATIONS=0``), as mlx-lm
    computes: for tests that compare a quantized model's numbers with mlx-lm's or a float twin's
    (int8 activations, the default, round x to 8 bits first)."""
    monkeypatch.setenv("EDGESPEC_Q8_ACTIVATIONS", "0")


def pytest_generate_tests(metafunc):
    kinds = getattr(metafunc.module, "TARGET_KINDS", None)
    if kinds and "target" in metafunc.fixturenames:
        metafunc.parametrize("target", list(kinds), indirect=True, scope="module")


@pytest.fixture(scope="module")
def target(request, tiny_models):
    kind = getattr(request, "param", "llama")
    return tiny_models.load(layers=getattr(request.module, "TARGET_LAYERS", 2), **KINDS[kind])


@pytest.fixture(scope="session")
def other(tiny_models):
    return tiny_models.load(seed=4, scale=0.3)
