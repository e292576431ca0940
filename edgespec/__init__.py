"""edgespec: MLX-native speculative decoding — a local LLM, several times faster, same output.

Public API::

    import edgespec
    target = edgespec.load("demo")                      # HF id, local dir, .gguf file or "demo"
    engine = edgespec.Engine(target, drafter=edgespec.make_drafter(
        edgespec.SpecConfig(method="draft", draft="path/to/draft"), target))
    result = engine.generate([{"role": "user", "content": "Hi"}], max_tokens=64)
    result.text, result.token_ids, result.stats.tau
"""

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
from .errors import EdgespecError  # noqa: E402
from .targets import Target, load  # noqa: E402

__all__ = [
    "BLAS", "Engine", "EdgespecError", "GenerationConfig", "Result", "SamplingConfig",
    "SpecConfig", "Stats", "Step", "Target", "load", "make_drafter",
]
__version__ = "0.1.0"
