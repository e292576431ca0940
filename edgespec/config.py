"""Frozen settings shared by the Python API, the CLI and the server.

Each dataclass validates itself in ``__post_init__`` and raises :class:`ConfigError` naming the
bad value and the allowed range, so every surface gets the same checks and the same messages.
Each field carries ``metadata["help"]``; the CLI builds its options from these definitions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .errors import ConfigError

METHODS = ("none", "draft", "lookup", "lookahead", "early-exit", "layer-skip", "quantized", "cascade",
           "auto")
"""Drafting methods the engine knows; extended as drafters are added."""

DTYPES = ("auto", "float32", "float16", "bfloat16")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen. ``temperature == 0`` means greedy (argmax)."""

    temperature: float = field(default=0.0, metadata={"help": "sampling temperature; 0 = greedy"})
    top_k: int = field(default=0, metadata={"help": "keep the k most likely tokens; 0 = off"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass in (0, 1]; 1 = off"})
    min_p: float = field(default=0.0, metadata={"help": "drop tokens below min_p × the top probability; 0 = off"})
    seed: int | None = field(default=None, metadata={"help": "random seed for reproducible sampling"})

    def __post_init__(self) -> None:
        t, k, p, m = self.temperature, self.top_k, self.top_p, self.min_p
        _check(_is_number(t) and 0.0 <= t <= 100.0, f"temperature must be a number in [0, 100], got {t!r}")
        _check(_is_int(k) and k >= 0, f"top_k must be an integer >= 0 (0 = off), got {k!r}")
        _check(_is_number(p) and 0.0 < p <= 1.0, f"top_p must be a number in (0, 1], got {p!r}")
        _check(_is_number(m) and 0.0 <= m < 1.0, f"min_p must be a number in [0, 1), got {m!r}")
        seed = self.seed
        _check(seed is None or (_is_int(seed) and 0 <= seed < 2**63),
               f"seed must be an integer in [0, 2**63) or None, got {seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SpecConfig:
    """Which drafter proposes tokens and how many per step."""

    method: str = field(default="none", metadata={"help": "drafting method: " + ", ".join(METHODS)})
    draft: str | None = field(default=None, metadata={"help": "draft model reference (method 'draft')"})
    num_draft: int = field(default=4, metadata={"help": "draft tokens per step (the starting length if adaptive)"})
    adaptive: bool = field(default=True, metadata={"help": "grow/shrink the draft length with acceptance"})
    max_draft: int = field(default=12, metadata={"help": "upper bound for the adaptive draft length"})
    exit_layer: int | None = field(default=None, metadata={"help": "layers the early-exit draft runs (method 'early-exit'); default: calibrated"})
    draft_bits: int = field(default=4, metadata={"help": "bits of the quantized self-draft (method 'quantized'): 2, 3, 4 or 8"})

    def __post_init__(self) -> None:
        _check(self.method in METHODS,
               f"unknown method {self.method!r}; choose one of: {', '.join(METHODS)}")
        n, mx_ = self.num_draft, self.max_draft
        _check(_is_int(n) and 1 <= n <= 64, f"num_draft must be an integer in [1, 64], got {n!r}")
        _check(_is_int(mx_) and n <= mx_ <= 64, f"max_draft must be an integer in [num_draft, 64], got {mx_!r}")
        _check(not (self.method in ("draft", "cascade") and not self.draft),
               f"method {self.method!r} needs a draft model: pass draft=REF (CLI: --draft REF)")
        e = self.exit_layer
        _check(e is None or (_is_int(e) and e >= 1), f"exit_layer must be an integer >= 1, got {e!r}")
        _check(e is None or self.method == "early-exit",
               f"exit_layer applies to method 'early-exit' only (method is {self.method!r})")
        _check(self.draft_bits in (2, 3, 4, 8) and _is_int(self.draft_bits),
               f"draft_bits must be 2, 3, 4 or 8, got {self.draft_bits!r}")


@dataclass(frozen=True)
class GenerationConfig:
    """When generation stops."""

    max_tokens: int = field(default=256, metadata={"help": "maximum number of new tokens"})
    stop: tuple[str, ...] = field(default=(), metadata={"help": "stop strings (not included in the output)"})

    def __post_init__(self) -> None:
        n = self.max_tokens
        _check(_is_int(n) and 1 <= n <= 1_000_000, f"max_tokens must be an integer >= 1, got {n!r}")
        stop = self.stop
        if isinstance(stop, str):
            object.__setattr__(self, "stop", (stop,))
        elif isinstance(stop, list):
            object.__setattr__(self, "stop", tuple(stop))
        _check(all(isinstance(s, str) and s for s in self.stop),
               f"stop must be non-empty strings, got {self.stop!r}")


def fields_of(cls) -> list[dataclasses.Field]:
    """The dataclass fields of a config class, for building CLI options and request schemas."""
    return list(dataclasses.fields(cls))
