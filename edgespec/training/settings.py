"""The settings of ``edgespec train``: one frozen dataclass, validated on construction, from which
the command's click options are generated (as ``options.py`` does for the decoding configs).

Contract: ``TrainSettings(**values)`` raises :class:`ConfigError` naming the bad value and what
is allowed; ``click_options()`` adds one ``--flag`` per field (but ``kind``, the command's
argument) in field order, each defaulting to None so that ``settings_from(kind, kw)`` can tell a
flag left out (the dataclass default applies) from one given. ``budget_s`` is the time budget in
seconds (None: no budget). ``lr_for_kind`` is the learning rate once the kind is known.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping

import click

from ..errors import ConfigError
from ..options import kind as option_type

KINDS = ("eagle3", "medusa", "corpus")
DEFAULT_LR = {"eagle3": 3e-4, "medusa": 1e-3}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> float:
    """Seconds in '90', '90s', '45m', '1.5h'; ConfigError otherwise."""
    m = _DURATION.match(text) if isinstance(text, str) else None
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"time_budget must be a positive duration such as 900, 900s, 45m or 1.5h; "
                          f"got {text!r}")
    return float(m.group(1)) * _UNIT[m.group(2)]


def _help(text: str, **extra) -> dict:
    return {"help": text, **extra}


@dataclass(frozen=True)
class TrainSettings:
    """Everything ``edgespec train`` does, with the defaults used for the shipped heads."""

    kind: str = field(default="eagle3", metadata=_help("head kind, or corpus", choices=KINDS))
    model: str = field(default="demo", metadata=_help("target: HF repo id, model dir, .gguf or 'demo'"))
    out: str | None = field(default=None, metadata=_help(
        "folder the head (or corpus) is written to", required=True))
    data: str | None = field(default=None, metadata=_help(
        "jsonl of prompts: {prompt}, {messages}, {conversations} or {turns} records; default: "
        "questions written by the model itself (Magpie)"))
    work_dir: str | None = field(default=None, metadata=_help(
        "data and feature store; default: ~/.cache/edgespec/train/<target fingerprint>/<source>"))
    questions: int = field(default=1200, metadata=_help("Magpie questions to write (without --data)"))
    question_tokens: int = field(default=96, metadata=_help("longest Magpie question, in tokens"))
    question_openers: bool = field(default=True, metadata=_help(
        "start each Magpie question with a generic task word (Write, Explain, Solve, ...: "
        "training/answers.py OPENERS) so the questions cover more kinds of task; "
        "--no-question-openers lets the model start them itself"))
    answer_tokens: int = field(default=256, metadata=_help("longest answer the target writes, in tokens"))
    gen_batch: int = field(default=64, metadata=_help("sequences per target forward while answering"))
    max_seq: int = field(default=1024, metadata=_help("prompt + answer tokens kept per sequence"))
    batch_size: int = field(default=8, metadata=_help("windows (sequences) per training step"))
    window: int = field(default=512, metadata=_help("rows per training window; longer sequences are split"))
    draft_vocab: int = field(default=8192, metadata=_help(
        "size of the draft vocabulary (the most frequent target tokens in the training answers): "
        "eagle3's LM head, or the rows of the target's LM head that medusa heads sharing it draft "
        "from"))
    soft_labels: int = field(default=0, metadata=_help(
        "eagle3: train on the model's K most probable next tokens and their probabilities at "
        "each position (stored with the features, in their own folder) instead of its argmax "
        "alone; 0: the argmax only"))
    depths: int = field(default=4, metadata=_help(
        "eagle3: training-time-test steps (the head fed its own hidden states), losses weighted 0.8^j"))
    medusa_heads: int = field(default=4, metadata=_help("medusa: number of heads (head i predicts t+2+i)"))
    medusa_layers: int = field(default=1, metadata=_help("medusa: residual blocks per head"))
    own_lm_head: bool = field(default=False, metadata=_help(
        "medusa: each head gets its own LM head instead of the target's frozen one"))
    epochs: float = field(default=2.0, metadata=_help("passes over the training split"))
    steps: int | None = field(default=None, metadata=_help("optimizer steps; default: from --epochs"))
    lr: float | None = field(default=None, metadata=_help(
        "peak learning rate; default: 3e-4 (eagle3), 1e-3 (medusa)"))
    warmup: float = field(default=0.05, metadata=_help("linear warm-up, as a fraction of the steps"))
    weight_decay: float = field(default=0.0, metadata=_help("AdamW weight decay"))
    clip: float = field(default=0.5, metadata=_help("gradient clipping: largest global gradient norm"))
    held_out: float = field(default=0.05, metadata=_help("fraction of sequences held out for evaluation"))
    eval_every: int = field(default=100, metadata=_help("steps between held-out evaluations"))
    checkpoint_every: int = field(default=200, metadata=_help("steps between checkpoints"))
    time_budget: str | None = field(default=None, metadata=_help(
        "stop cleanly (checkpoint, head saved) after this long, e.g. 3600, 50m, 1h; rerun to resume"))
    seed: int = field(default=0, metadata=_help("seed of the questions, the split, the init and the order"))
    init_from: str | None = field(default=None, metadata=_help(
        "start from this trained head (a head folder of the same kind for the same model) "
        "instead of a fresh one: more epochs or another learning rate on top of a finished run"))
    resume: bool = field(default=True, metadata=_help(
        "continue training from the last checkpoint; --no-resume starts training over (the data "
        "phases always keep what is done)"))

    def __post_init__(self) -> None:
        _one_of("kind", self.kind, KINDS)
        for name in ("model", "out"):
            v = getattr(self, name)
            _check(isinstance(v, str) and v.strip(), f"{name} must be a non-empty string "
                   f"(CLI: --{name} ...), got {v!r}")
        for name in ("data", "work_dir", "init_from"):
            v = getattr(self, name)
            _check(v is None or (isinstance(v, str) and v.strip()),
                   f"{name} must be a path or None, got {v!r}")
        for name, lo, hi in (("questions", 1, 10**7), ("question_tokens", 8, 4096),
                             ("answer_tokens", 1, 32768), ("gen_batch", 1, 1024),
                             ("max_seq", 16, 10**6), ("batch_size", 1, 4096), ("window", 8, 10**6),
                             ("draft_vocab", 2, 10**7), ("depths", 1, 16), ("soft_labels", 0, 64),
                             ("medusa_heads", 1, 16), ("medusa_layers", 1, 8),
                             ("eval_every", 1, 10**9), ("checkpoint_every", 1, 10**9),
                             ("seed", 0, 2**31 - 1)):
            _int_in(name, getattr(self, name), lo, hi)
        _check(self.steps is None or (_is_int(self.steps) and 1 <= self.steps <= 10**9),
               f"steps must be an integer in [1, 1000000000] or None, got {self.steps!r}")
        _number_in("epochs", self.epochs, 0.0, 1000.0, low_open=True)
        _check(self.lr is None or (_is_number(self.lr) and 0 < self.lr <= 1),
               f"lr must be a number in (0, 1] or None, got {self.lr!r}")
        _number_in("warmup", self.warmup, 0.0, 0.5)
        _number_in("weight_decay", self.weight_decay, 0.0, 1.0)
        _number_in("clip", self.clip, 0.0, 1e6, low_open=True)
        _number_in("held_out", self.held_out, 0.0, 0.5, low_open=True)
        for name in ("own_lm_head", "resume", "question_openers"):
            _check(isinstance(getattr(self, name), bool),
                   f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.time_budget is not None:
            parse_duration(self.time_budget)

    @property
    def budget_s(self) -> float | None:
        return None if self.time_budget is None else parse_duration(self.time_budget)

    @property
    def lr_for_kind(self) -> float:
        return self.lr if self.lr is not None else DEFAULT_LR[self.kind]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _check(ok, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _one_of(name: str, value, allowed: tuple) -> None:
    _check(value in allowed, f"{name} must be one of: {', '.join(allowed)}; got {value!r}")


def _int_in(name: str, value, lo: int, hi: int) -> None:
    _check(_is_int(value) and lo <= value <= hi,
           f"{name} must be an integer in [{lo}, {hi}], got {value!r}")


def _number_in(name: str, value, lo: float, hi: float, low_open: bool = False) -> None:
    ok = _is_number(value) and (lo < value if low_open else lo <= value) and value <= hi
    _check(ok, f"{name} must be a number in {'(' if low_open else '['}{lo}, {hi}], got {value!r}")


# --- the command's options, generated from the fields ----------------------------------------

FLAGS = [f for f in dataclasses.fields(TrainSettings) if f.name != "kind"]


def _describe(f: dataclasses.Field) -> str:
    text = f.metadata.get("help", "")
    if "default:" in text or f.default is None:
        return text
    shown = str(f.default).lower() if isinstance(f.default, bool) else f.default
    return f"{text} [default: {shown}]"


def _option(f: dataclasses.Field) -> Callable:
    flag = "--" + f.name.replace("_", "-")
    t = option_type(f)
    if t is bool:
        return click.option(f"{flag}/--no-{flag[2:]}", f.name, default=None, help=_describe(f))
    return click.option(flag, f.name, default=None, type=t, help=_describe(f),
                        required=f.metadata.get("required", False))


def click_options(fn: Callable) -> Callable:
    """Decorator: one option per settings field (but ``kind``), in field order."""
    for f in reversed(FLAGS):
        fn = _option(f)(fn)
    return fn


def settings_from(kind: str, kw: Mapping) -> TrainSettings:
    """The settings of one command line: the flags given (None: not given) over the defaults."""
    names = {f.name for f in FLAGS}
    return TrainSettings(kind=kind, **{k: v for k, v in kw.items() if k in names and v is not None})
