"""The values of a model's config.json that no model can have, refused before a model is built.

Contract: ``check_values(config, args_class, path)`` runs before the family's ``from_dict``: every
numeric field of the family's ``ModelArgs`` that the config gives (at its top level or under
``text_config``) must be of its type and range -- sizes and counts integers >= 1 (>= 0 where 0
means none), norm epsilons, RoPE bases and scales finite numbers > 0 -- and
``num_hidden_layers`` at most the layers the weight files hold (read from the safetensors
headers, no tensor loaded). ``check_shapes(args, path)`` runs on the parsed args: the head count
divides the hidden size where the head size is derived from them, the key/value heads divide
the heads, an expert count covers the experts chosen per token. Each refusal is one
:class:`ModelLoadError` naming the config file, the field, its value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import struct
from pathlib import Path

from ..errors import ModelLoadError

ZERO_IS_NONE = frozenset({  # counts and sizes where 0 means "none" (a dense layer, no sharing)
    "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "num_kv_shared_layers", "hidden_size_per_layer_input"})
FRACTIONS = frozenset({"partial_rotary_factor"})  # a share of the head's dimensions: (0, 1]
_LAYER_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_OTHER_TOWERS = ("mtp.", "vision", "visual", "audio")  # layers that are not the decoder's


def _kind(f: dataclasses.Field) -> tuple[type, bool] | None:
    """(int or float, whether null is allowed) of a numeric field; None for the others."""
    name = str(f.type).replace(" ", "")
    for t in (int, float):
        if name in (t.__name__, f"{t.__name__}|None"):
            return t, name.endswith("|None")
    return None


def allowed(name: str, kind: type, nullable: bool) -> str:
    """What the field ``name`` of ``kind`` may hold, in words."""
    if kind is int:
        text = "an integer >= 0 (0: none)" if name in ZERO_IS_NONE else "an integer >= 1"
    else:
        text = "a number in (0, 1]" if name in FRACTIONS else "a finite number > 0"
    return text + (" or null" if nullable else "")


def _ok(value, name: str, kind: type, nullable: bool) -> bool:
    if value is None:
        return nullable
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind is int:
        return isinstance(value, int) and value >= (0 if name in ZERO_IS_NONE else 1)
    if not math.isfinite(value):
        return False
    return 0 < value <= 1 if name in FRACTIONS else value > 0


def _refuse(path: Path, field: str, value, what: str) -> ModelLoadError:
    return ModelLoadError(f"{path / 'config.json'}: {field} is {value!r}; it must be {what}")


def check_values(config: dict, args_class: type, path: Path) -> None:
    """ModelLoadError for the first numeric field of ``args_class`` that ``config`` (or its
    ``text_config``) gives a value outside its range, or a layer count past the weights. The
    "every n-th layer" fields (``PERIODS``) are left to ``DecoderArgs.check_layers``."""
    path = Path(path)
    inner = config.get("text_config")
    sources = [("", config)] + ([("text_config.", inner)] if isinstance(inner, dict) else [])
    for f in dataclasses.fields(args_class):
        kind = _kind(f)
        if kind is None or f.name in args_class.PERIODS:  # those: ``check_layers``'s own words
            continue
        for prefix, source in sources:
            if f.name in source and not _ok(source[f.name], f.name, *kind):
                raise _refuse(path, prefix + f.name, source[f.name], allowed(f.name, *kind))
    stored = stored_layers(path)
    for prefix, source in sources:
        n = source.get("num_hidden_layers")
        if stored is not None and isinstance(n, int) and n > stored:
            raise _refuse(path, prefix + "num_hidden_layers", n,
                          f"an integer in [1, {stored}] (the weight files hold layers "
                          f"0..{stored - 1})")


def stored_layers(path: Path) -> int | None:
    """The decoder layers the weight files of ``path`` hold (the highest ``layers.N`` index + 1,
    MTP, vision and audio towers aside), read from the safetensors headers; None when there
    are none or a header cannot be read (the weight reader names that problem)."""
    top = -1
    for file in sorted(Path(path).glob("*.safetensors")):
        try:
            with open(file, "rb") as fh:
                size = struct.unpack("<Q", fh.read(8))[0]
                keys = json.loads(fh.read(size))
        except (OSError, ValueError, struct.error):
            return None
        for key in keys if isinstance(keys, dict) else ():
            m = _LAYER_KEY.search(key)
            if m and not any(t in key for t in _OTHER_TOWERS):
                top = max(top, int(m.group(1)))
    return top + 1 if top >= 0 else None


def check_shapes(args, path: Path) -> None:
    """ModelLoadError naming the fields when the parsed ``args`` cannot shape a model."""
    a, path = args, Path(path)
    derived = a.head_dim == a.hidden_size // a.num_attention_heads  # (where not given)
    if derived and a.hidden_size % a.num_attention_heads:
        raise _refuse(path, "num_attention_heads", a.num_attention_heads,
                      f"a divisor of hidden_size ({a.hidden_size}) when head_dim is not given")
    pairs = [("num_key_value_heads", "num_attention_heads"),
             ("num_global_key_value_heads", "num_attention_heads"),
             ("linear_num_key_heads", "linear_num_value_heads")]
    for part, whole in pairs:
        p, w = getattr(a, part, None), getattr(a, whole, None)
        if p and w and w % p:
            raise _refuse(path, part, p, f"a divisor of {whole} ({w})")
    experts = getattr(a, "num_local_experts", None) or getattr(a, "num_experts", None)
    chosen = getattr(a, "num_experts_per_tok", None)
    if experts and chosen is not None and not 1 <= chosen <= experts:
        raise _refuse(path, "num_experts_per_tok", chosen,
                      f"an integer in [1, {experts}] (the experts there are)")
