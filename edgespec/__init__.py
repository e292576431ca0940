"""edgespec: MLX-native speculative decoding — a local LLM, faster, same output.

For apps (docs/api.md)::

    import edgespec
    llm = edgespec.load("demo")                     # HF id, local dir, .gguf file or "demo"
    print(llm.chat("What is the capital of France?", max_tokens=32).text)
    for step in llm.stream("Tell me a joke"):        # step.segments: which text was drafted
        print(step.text, end="")
    result = await llm.achat(messages, method="auto", temperature=0.7)   # from asyncio

Options (``method``, ``num_draft``, ``temperature``, ``max_tokens``, ``stop``, ...) are the fields
of the config classes, the same as the CLI's flags and the server's request fields.

The engine underneath, for one thread that drives decoding itself::

    target = edgespec.load_target("demo")
    engine = edgespec.Engine(target, drafter=edgespec.make_drafter(
        edgespec.SpecConfig(method="lookup"), target))
    engine.generate([{"role": "user", "content": "Hi"}], max_tokens=64).stats.tau
"""

import importlib
import warnings

from .loading import _blas
from .errors import ConfigError as _ConfigError

try:
    BLAS = _blas.load_optimized_blas()  # must run before mlx is imported anywhere
except _ConfigError as _e:  # a bad EDGESPEC_BLAS must not make the package unimportable
    warnings.warn(f"{_e}; using MLX's reference BLAS (slow)", stacklevel=2)
    BLAS = _blas.BlasInfo("reference", None, "reference", None, str(_e))

from .config import GenerationConfig, SamplingConfig, SpecConfig  # noqa: E402
from .drafters import make_drafter  # noqa: E402
from .engine import Engine, Result, Stats, Step  # noqa: E402
from .errors import ConfigError, ContextOverflowError, EdgespecError  # noqa: E402
from .stream_text import Segment  # noqa: E402
from .targets import Target  # noqa: E402
from .targets import load as load_target  # noqa: E402

__all__ = [
    "BLAS", "LLM", "AsyncStream", "ConfigError", "ContextOverflowError", "EdgespecError",
    "Engine", "GenerationConfig", "Result", "SamplingConfig", "Segment", "SpecConfig", "Stats",
    "Step", "Stream", "Target", "load", "load_target", "make_drafter",
]
__version__ = "0.1.0"

# The app API loads on first use: it generates its options from the config classes when it is
# imported, which must not happen as a side effect of importing the package (or of
# ``import edgespec.config``; tests/test_options.py extends those classes after that).
_LAZY = {"LLM": "llm", "load": "llm", "Stream": "streams", "AsyncStream": "streams"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'edgespec' has no attribute {name!r}")
    return vars(importlib.import_module(f".{_LAZY[name]}", __name__))[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
