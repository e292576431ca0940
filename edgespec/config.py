"""Frozen settings shared by the Python API, the CLI and the server.

Each dataclass validates itself in ``__post_init__`` and raises :class:`ConfigError` naming the
bad value and the allowed range, so every surface gets the same checks and the same messages.
These classes are the one definition of every option: ``options.py`` generates the CLI flags, the
server's request fields and the configs built from either from their fields (a field's
``metadata["help"]`` is its help text; ``metadata["choices"]`` its allowed values).
The method names and what each method reads come from the method table (``methods.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from . import methods
from .errors import ConfigError

METHODS = methods.NAMES
"""Drafting methods the engine knows, in the method table's order."""

DTYPES = ("auto", "float32", "float16", "bfloat16")
MAX_DRAFT = 12
"""``max_draft`` when not given: this, or ``num_draft`` when that is larger."""
HEAD_BITS = (0, 4, 8)  # head_bits: float32, or the native kernels' 4- and 8-bit products


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
    frequency_penalty: float = field(default=0.0, metadata={
        "help": "subtract this times a token's count in the generated text from its logit "
                "(OpenAI's definition), in [-2, 2]; 0 = off"})
    presence_penalty: float = field(default=0.0, metadata={
        "help": "subtract this from the logit of every token already generated (OpenAI's "
                "definition), in [-2, 2]; 0 = off"})
    repetition_penalty: float = field(default=1.0, metadata={
        "help": "divide positive logits (multiply negative ones) of tokens in the prompt or "
                "the generated text by this (HF / llama.cpp definition), in (0, 10]; 1 = off"})

    def __post_init__(self) -> None:
        t, k, p, m = self.temperature, self.top_k, self.top_p, self.min_p
        _check(_is_number(t) and 0.0 <= t <= 100.0, f"temperature must be a number in [0, 100], got {t!r}")
        _check(_is_int(k) and k >= 0, f"top_k must be an integer >= 0 (0 = off), got {k!r}")
        _check(_is_number(p) and 0.0 < p <= 1.0, f"top_p must be a number in (0, 1], got {p!r}")
        _check(_is_number(m) and 0.0 <= m < 1.0, f"min_p must be a number in [0, 1), got {m!r}")
        seed = self.seed
        _check(seed is None or (_is_int(seed) and 0 <= seed < 2**63),
               f"seed must be an integer in [0, 2**63) or None, got {seed!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            _check(_is_number(v) and -2.0 <= v <= 2.0, f"{name} must be a number in [-2, 2], got {v!r}")
        r = self.repetition_penalty
        _check(_is_number(r) and 0.0 < r <= 10.0,
               f"repetition_penalty must be a number in (0, 10] (1 = off), got {r!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SpecConfig:
    """Which drafter proposes tokens and how many per step.

    A field whose metadata says ``exclusive`` is an option of the methods that read it (the
    method table's ``reads``): setting it for another method is an error, not silently ignored.
    """

    method: str = field(default="none", metadata={
        "help": "drafting method: " + ", ".join(METHODS), "choices": METHODS})
    draft: str | None = field(default=None, metadata={
        "help": "draft model reference (methods " + ", ".join(methods.readers("draft")) + ")"})
    num_draft: int = field(default=4, metadata={"help": "draft tokens per step (the starting length if adaptive)"})
    adaptive: bool = field(default=True, metadata={"help": "grow/shrink the draft length with acceptance"})
    max_draft: int | None = field(default=None, metadata={
        "help": f"upper bound for the adaptive draft length; default: max({MAX_DRAFT}, num_draft)"})
    exit_layer: int | None = field(default=None, metadata={
        "help": "layers the early-exit draft runs (method 'early-exit'); default: calibrated",
        "exclusive": True})
    head: str | None = field(default=None, metadata={
        "help": "trained head directory (methods " + ", ".join(methods.readers("head"))
                + "); default: the one found for the model (`edgespec train` makes one)",
        "exclusive": True})
    draft_bits: int = field(default=4, metadata={"help": "bits of the quantized self-draft (method 'quantized'): 2, 3, 4 or 8"})
    head_bits: int | None = field(default=None, metadata={
        "help": "bits the EAGLE-3 head's weights are group-quantized to when it is loaded (methods "
                + ", ".join(methods.readers("head_bits")) + "): 8 or 4, or 0 for float32; default: "
                "8 where the native CPU kernels run its products, else float32",
        "exclusive": True})

    def __post_init__(self) -> None:
        method = methods.get(self.method) if isinstance(self.method, str) else None
        _check(method is not None, f"method must be a string, one of: {', '.join(METHODS)}; "
                                   f"got {self.method!r}")
        n = self.num_draft
        _check(_is_int(n) and 1 <= n <= 64, f"num_draft must be an integer in [1, 64], got {n!r}")
        if self.max_draft is None:
            object.__setattr__(self, "max_draft", max(MAX_DRAFT, n))
        m = self.max_draft
        _check(_is_int(m) and n <= m <= 64, f"max_draft must be an integer in [num_draft, 64] "
                                            f"(num_draft is {n}; CLI: --max-draft), got {m!r}")
        _check(isinstance(self.adaptive, bool), f"adaptive must be true or false, got {self.adaptive!r}")
        d = self.draft
        _check(d is None or (isinstance(d, str) and d.strip()),
               f"draft must be a model reference (a non-empty string) or None, got {d!r}")
        _check(not (method.needs_draft and d is None),
               f"method {self.method!r} needs a draft model: pass draft=REF (CLI: --draft REF)")
        hd = self.head
        _check(hd is None or (isinstance(hd, str) and hd.strip()),
               f"head must be a head directory (a non-empty string) or None, got {hd!r}")
        e = self.exit_layer
        _check(e is None or (_is_int(e) and e >= 1), f"exit_layer must be an integer >= 1, got {e!r}")
        _check(self.draft_bits in (2, 3, 4, 8) and _is_int(self.draft_bits),
               f"draft_bits must be 2, 3, 4 or 8, got {self.draft_bits!r}")
        _check(self.head_bits is None or (_is_int(self.head_bits) and self.head_bits in HEAD_BITS),
               f"head_bits must be 0 (float32), 4 or 8, got {self.head_bits!r}")
        for f in dataclasses.fields(self):
            if f.metadata.get("exclusive") and vars(self)[f.name] != f.default:
                owners = methods.readers(f.name)
                _check(f.name in method.reads, f"{f.name} applies to method "
                       f"{' or '.join(map(repr, owners))} only (method is {self.method!r})")


@dataclass(frozen=True)
class GenerationConfig:
    """When generation stops."""

    max_tokens: int = field(default=256, metadata={"help": "maximum number of new tokens"})
    stop: tuple[str, ...] = field(default=(), metadata={
        "help": "stop strings (not included in the output); not with structured output (a JSON "
                "response format or schema, a required tool call), which ends where complete"})

    def __post_init__(self) -> None:
        n = self.max_tokens
        _check(_is_int(n) and 1 <= n <= 1_000_000,
               f"max_tokens must be an integer in [1, 1000000], got {n!r}")
        stop = self.stop
        if isinstance(stop, str):
            object.__setattr__(self, "stop", (stop,))
        elif isinstance(stop, list):
            object.__setattr__(self, "stop", tuple(stop))
        _check(isinstance(self.stop, tuple) and all(isinstance(s, str) and s for s in self.stop),
               f"stop must be a non-empty string or a list of them, got {self.stop!r}")


@dataclass(frozen=True)
class ModelConfig:
    """Which model is loaded, and in which dtype."""

    model: str = field(default="demo", metadata={"help": "HF repo id, local model dir, .gguf file, 'demo' or 'gemma3-270m'"})
    dtype: str | None = field(default=None, metadata={
        "help": "weight dtype; default: float32 on CPU, native on GPU", "choices": DTYPES})

    def __post_init__(self) -> None:
        _check(isinstance(self.model, str) and self.model.strip(),
               f"model must be a model reference (a non-empty string), got {self.model!r}")
        _check(self.dtype is None or self.dtype in DTYPES,
               f"dtype must be one of: {', '.join(DTYPES)} (or None for the default), got {self.dtype!r}")

