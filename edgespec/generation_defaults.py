"""Sampling defaults: what a surface samples with where a request does not say.

Contract, each level over the next:

1. what the request gives (a CLI flag, a Python API keyword, an OpenAI request field) always
   wins, field by field; temperature 0 (greedy) stays available everywhere;
2. the model's own settings, from the ``generation_config.json`` beside its weights
   (:func:`model_sampling`), taken whole when the file sets any: the fields it leaves out are
   off, so a surface's fallback never mixes into the authors' choice;
3. the surface's fallback (``options.SURFACES``): :data:`CHAT` for ``edgespec chat``; OpenAI's
   temperature 1 for a served request; the config dataclasses' (greedy) for the Python API,
   like transformers' ``generate``. ``bench`` and ``generate`` do not read the model's file:
   they are greedy unless told (a benchmark compares methods on fixed settings).

Reading ``generation_config.json`` (the transformers file; vLLM reads it the same way):
``temperature``, ``top_p``, ``top_k``, ``min_p`` and ``repetition_penalty`` are taken as they
are; ``do_sample: false`` means greedy (temperature 0), as in transformers; ``do_sample: true``
without a temperature means transformers' temperature 1. A value edgespec cannot use (out of
range, not a number) is left out with a warning naming the file: a model's file must not make
the model unusable. GGUF files carry no such settings here, so the demo model has none and the
chat uses :data:`CHAT`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from pathlib import Path

from .config import SamplingConfig
from .errors import ConfigError

log = logging.getLogger("edgespec.generation_defaults")

FILE = "generation_config.json"
READ = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
"""The sampling fields a generation_config.json may set (same names in SamplingConfig)."""

CHAT = {"temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.1}
"""The chat's sampling where the model sets none: the usual chat sampling (temperature 0.7,
nucleus 0.9) and the HF / llama.cpp repetition penalty 1.1 (Ollama's default). A small model
such as the demo, greedy or sampled without a penalty, answers a poem request with one line
repeated to the token limit; 1.1 stopped that at temperature 0.7 and at 0.2, a milder 1.05 only
at 0.7. The penalty costs speed (the drafters do not see it, so fewer drafts are accepted): see
docs/measurements.md, "chat defaults" (``scripts/chat_defaults_haiku.py``,
``scripts/chat_defaults_speed.py``)."""


def model_sampling(model_dir: str | Path | None) -> dict:
    """The SamplingConfig fields the model's generation_config.json sets, completed with the
    dataclass's values (off) for the rest; ``{}`` when the file is absent or sets none."""
    if model_dir is None:
        return {}
    path = Path(model_dir) / FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        log.warning("%s is unreadable (%s); its sampling settings are not used", path, e)
        return {}
    if not isinstance(raw, dict):
        return {}
    found = {k: raw[k] for k in READ if raw.get(k) is not None and _usable(path, k, raw[k])}
    if raw.get("do_sample") is False:
        found = {"temperature": 0.0, **({k: v for k, v in found.items()
                                         if k == "repetition_penalty"})}
    elif raw.get("do_sample") is True:
        found.setdefault("temperature", 1.0)
    if not found:
        return {}
    off = {f.name: f.default for f in dataclasses.fields(SamplingConfig) if f.name != "seed"}
    return {**off, **found}


def _usable(path: Path, name: str, value) -> bool:
    try:
        SamplingConfig(**{name: value})
    except ConfigError as e:
        log.warning("%s: %s; left out", path, e)
        return False
    return True


def describe(values: Mapping) -> str:
    """The sampling settings in one line: ``temperature 0.7 · top_p 0.9 · repetition_penalty
    1.1`` (the fields that are not off), or ``greedy``."""
    off = {f.name: f.default for f in dataclasses.fields(SamplingConfig)}
    if not values.get("temperature"):
        rest = [f"{k} {values[k]:g}" for k in ("repetition_penalty", "frequency_penalty",
                                                 "presence_penalty")
                if k in values and values[k] != off[k]]
        return " · ".join(["greedy", *rest])
    return " · ".join(f"{k} {v:g}" for k, v in values.items()
                      if k != "seed" and k in off and v != off[k])
