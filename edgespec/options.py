"""Every surface's options, generated from the config dataclasses of ``config.py``.

Contract: the flags of ``generate``, ``bench``, ``serve``, ``chat`` (and ``doctor``,
``make-draft``) come from ``click_options``, the server's request fields from ``SURFACES["request"]``
(``server/schemas.py``), the Python API's keywords from ``SURFACES["python"]`` (``edgespec.load``)
and ``SURFACES["call"]`` (one call; ``checked`` rejects other names), and what any surface was
given becomes configs through ``values`` / ``config`` / ``spec_for``, so a field added to a
config class shows up everywhere with the same type, help, default and validation. A surface whose default deliberately differs from the
dataclass says so here, in ``SURFACES``, and its --help shows why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import click

from .config import GenerationConfig, ModelConfig, SamplingConfig, SpecConfig
from .drafters.default import RULE as default_rule, interactive_method
from .errors import ConfigError
from .generation_defaults import CHAT, READ
from .methods import get as method_entry

CONFIGS = (ModelConfig, SpecConfig, SamplingConfig, GenerationConfig)
_KINDS = {"bool": bool, "int": int, "float": float, "str": str, "tuple[str, ...]": tuple}
_ALIASES = {"temperature": ("--temp",)}  # short spellings kept for existing scripts


@dataclass(frozen=True)
class Default:
    """A surface's own default for a field: a value, a function of the options given, or None
    (decided at run time); ``why`` is shown in --help."""

    value: object
    why: str


@dataclass(frozen=True)
class Surface:
    """The config fields one surface takes as options (all of ``classes`` but ``skip``)."""

    classes: tuple[type, ...]
    skip: tuple[str, ...] = ()
    defaults: Mapping[str, Default] = field(default_factory=dict)

    def fields(self) -> list[dataclasses.Field]:
        return [f for cls in self.classes for f in dataclasses.fields(cls) if f.name not in self.skip]


_INTERACTIVE = Default(lambda given: interactive_method(given.get("draft"), head=given.get("head")),
                       default_rule.format(draft="--draft"))
_INTERACTIVE_PY = Default(_INTERACTIVE.value, default_rule.format(draft="draft=REF"))
_SERVER_SPEC = {f.name: Default(None, f"the server's --{f.name.replace('_', '-')}")
                for f in dataclasses.fields(SpecConfig)}  # a request's speculation: serve's options
# sampling: the model's own settings come first (generation_defaults.py), then these fallbacks
_NO_MODEL = "where the model's generation_config.json sets no sampling"
_CHAT = {k: Default(v, f"the chat's, {_NO_MODEL}") for k, v in CHAT.items()}
_OWN = {f.name: Default(None, f"the model's generation_config.json, else {f.default}")
        for f in dataclasses.fields(SamplingConfig) if f.name in READ}

SURFACES: dict[str, Surface] = {
    "generate": Surface(CONFIGS, defaults={"method": _INTERACTIVE}),
    "bench": Surface(CONFIGS, skip=("method",), defaults={  # bench takes --methods, a list
        "max_tokens": Default(128, "bench's own, so a 24-prompt run takes minutes on a CPU")}),
    "chat": Surface(CONFIGS, skip=("model",),  # MODEL: an argument
                    defaults={"method": _INTERACTIVE, **_OWN, **_CHAT}),
    "serve": Surface((ModelConfig, SpecConfig), defaults={"method": _INTERACTIVE}),
    "request": Surface((SpecConfig, SamplingConfig, GenerationConfig),
                       skip=("draft", "head"),  # loaded once when the server starts, never by a request
                       defaults={**_SERVER_SPEC, **_OWN,
                                 "temperature": Default(1.0, f"OpenAI's, {_NO_MODEL}"),
                                 "max_tokens": Default(None, "the server's --max-tokens-limit")}),
    "python": Surface(CONFIGS, defaults={"method": _INTERACTIVE_PY, **_OWN}),  # edgespec.load()
    "call": Surface((SpecConfig, SamplingConfig, GenerationConfig),  # llm.chat(..., **options)
                    skip=("draft", "head")),  # loaded once, with the model
    "doctor": Surface((ModelConfig,)),
    "make-draft": Surface((ModelConfig,), skip=("dtype",)),
}


def kind(f: dataclasses.Field) -> type:
    """The Python type of a field's values ('int | None' -> int; 'tuple[str, ...]' -> tuple)."""
    name = str(f.type).removesuffix(" | None")
    if name not in _KINDS:
        raise TypeError(f"config field {f.name}: no option type for annotation {f.type!r}")
    return _KINDS[name]


def describe(f: dataclasses.Field, surface: str) -> str:
    """A field's help on ``surface``: its help text and its default there (and why it differs)."""
    text = f.metadata.get("help", "")
    own = SURFACES[surface].defaults.get(f.name)
    if own is not None:
        shown = own.why if own.value is None or callable(own.value) else f"{own.value}: {own.why}"
        return f"{text} [default: {shown}]"
    if "default:" in text or f.default in (None, ()):
        return text
    return f"{text} [default: {str(f.default).lower() if kind(f) is bool else f.default}]"


def click_options(surface: str) -> Callable:
    """Decorator adding ``surface``'s options to a click command, in the classes' field order.

    Every option defaults to None (not given), so ``values`` can tell a flag left out (the
    dataclass's or the surface's default applies) from one given with the default value.
    """

    def decorate(fn):
        for f in reversed(SURFACES[surface].fields()):
            fn = _option(f, surface)(fn)
        return fn

    return decorate


def _option(f: dataclasses.Field, surface: str):
    flag = "--" + f.name.replace("_", "-")
    t, help_text = kind(f), describe(f, surface)
    if t is bool:
        return click.option(f"{flag}/--no-{flag[2:]}", f.name, default=None, help=help_text)
    if t is tuple:
        return click.option(flag, f.name, multiple=True, help=help_text + " [repeatable]")
    choices = f.metadata.get("choices")
    return click.option(flag, *_ALIASES.get(f.name, ()), f.name, default=None, help=help_text,
                        type=click.Choice(choices) if choices else t)


def given(surface: str, kw: Mapping) -> dict:
    """The options of ``surface`` present in ``kw`` (None or an empty repeatable: not given)."""
    names = {f.name for f in SURFACES[surface].fields()}
    return {k: v for k, v in kw.items() if k in names and v is not None and v != ()}


def checked(surface: str, kw: Mapping) -> dict:
    """``given``, for keyword arguments: a name that is not an option of ``surface`` is a
    ConfigError naming it and listing the options."""
    names = [f.name for f in SURFACES[surface].fields()]
    unknown = sorted(set(kw) - set(names))
    if unknown:
        raise ConfigError(f"unknown option {unknown[0]!r}; the options are: {', '.join(names)}")
    return given(surface, kw)


def values(surface: str, kw: Mapping, model: Mapping | None = None) -> dict:
    """The options given, over ``model`` (the loaded model's own sampling settings:
    ``generation_defaults.model_sampling``), over the surface's own defaults."""
    out = {**(model or {}), **given(surface, kw)}
    for name, own in SURFACES[surface].defaults.items():
        if name not in out and own.value is not None:
            out[name] = own.value(out) if callable(own.value) else own.value
    return out


def pick(cls: type, options: Mapping, skip: tuple[str, ...] = ()) -> dict:
    """The options that are fields of ``cls`` (but ``skip``)."""
    names = {f.name for f in dataclasses.fields(cls)} - set(skip)
    return {k: v for k, v in options.items() if k in names}


def config(cls: type, options: Mapping):
    """``cls`` built from the options that are its fields (the others are left out)."""
    return cls(**pick(cls, options))


def spec_for(method: str, shared: Mapping, own: Mapping | None = None) -> SpecConfig:
    """The SpecConfig of ``method`` from ``shared`` options, meant for several methods (an
    exclusive one, such as ``exit_layer``, goes only to the methods that read it), and ``own``
    options, meant for this method alone (all apply, so a wrong one is an error)."""
    reads = method_entry(method).reads
    keep = {k: v for k, v in pick(SpecConfig, shared, skip=("method",)).items()
            if k in reads or not _exclusive(k)}
    keep.update(pick(SpecConfig, own or {}, skip=("method",)))
    return SpecConfig(method=method, **keep)


def _exclusive(name: str) -> bool:
    return any(f.metadata.get("exclusive") for f in dataclasses.fields(SpecConfig) if f.name == name)


class Configs(NamedTuple):
    model: ModelConfig
    spec: SpecConfig
    sampling: SamplingConfig
    generation: GenerationConfig


def configs(surface: str, kw: Mapping, model: Mapping | None = None) -> Configs:
    """All four configs from a command's parsed options (or Python keyword arguments), over
    ``model``'s sampling settings (see ``values``)."""
    v = values(surface, kw, model)
    return Configs(*(config(cls, v) for cls in CONFIGS))
