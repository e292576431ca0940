"""A target's trained heads and corpora, found, checked and loaded once.

Contract: ``load_head_for(head, target, kind)`` is the (path, module) of the head folder ``head``
(else of the one ``find_head`` finds for ``target``), loaded once per (folder, config
modification time) and target, kept as long as the target is; ``head_kinds(target, head)`` the
kinds of head that can draft for ``target``, read from config files alone (``kind.py``);
``head_in_bits`` an EAGLE-3 head's group-quantized copy, made once per target, head and bits.
A missing head is a :class:`ConfigError` naming the model and ``edgespec train``; a head made
for another target a :class:`HeadError` naming both values.
"""

from __future__ import annotations

import weakref
from pathlib import Path

from ..errors import ConfigError
from .find import a_head, find_head
from .kind import KINDS, config_kind, fitting_kind

# Per target (weakly: a target's heads go with it), per head folder (path, config mtime): the
# loaded (kind, module), and the kinds alone for ``head_kinds``, which only needs a head's kind
# and fit (its module is not shared with a drafter that may run on another thread).
_loaded: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_kinds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_quantized: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _key(path: Path) -> tuple:
    return str(path.resolve()), (path / "config.json").stat().st_mtime_ns


def _head_dir(path, kind: str) -> Path:
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"head {str(path)!r} is not a head directory (it has no config.json); "
                          f"`edgespec train {kind}` writes one")
    return path


def _load(path: Path, target) -> tuple[str, object]:
    """(kind, module) of the head folder ``path``, checked against ``target``: a network head
    (EAGLE-3, Medusa) or a corpus (its n-gram table)."""
    from .corpus import load_corpus
    from .formats import load_head

    if config_kind(path) == "corpus":
        return "corpus", load_corpus(path, target)
    config, module = load_head(path, target)
    return config.kind, module


def load_head_for(head, target, kind: str) -> tuple[Path, object]:
    """(path, module) of the head folder ``head`` (None: the one ``find_head`` finds for
    ``target``); ConfigError naming the model and ``edgespec train`` when there is none,
    ConfigError naming both kinds when the folder holds another kind."""
    path = head if head is not None else find_head(target, kind)
    if path is None:
        raise ConfigError(
            f"method {kind!r} needs a trained {kind} head and none was found for model "
            f"{target.name}: pass --head PATH, or train one with `edgespec train {kind} --model "
            f"{target.path or target.name} --out DIR`")
    path = _head_dir(path, kind)
    loaded = _loaded.setdefault(target, {})
    key = _key(path)
    if key not in loaded:
        loaded[key] = _load(path, target)
        _kinds.setdefault(target, {})[key] = loaded[key][0]
    have, module = loaded[key]
    if have != kind:
        raise ConfigError(f"head {str(path)!r} is {a_head(have)}; method {kind!r} needs "
                          f"{a_head(kind)}")
    return path, module


def head_kinds(target, head=None) -> frozenset[str]:
    """The kinds ('eagle3', 'medusa', 'corpus') of head that can draft for ``target``: the kind
    of ``head`` when one is given (a head directory; HeadError when it does not fit the
    target), else each kind ``find_head`` finds a head of."""
    if head is None:
        return frozenset(k for k in KINDS if find_head(target, k) is not None)
    path = _head_dir(head, "eagle3, medusa or corpus")
    known = _kinds.setdefault(target, {})
    key = _key(path)
    if key not in known:
        known[key] = fitting_kind(path, target)
    return frozenset({known[key]})


def head_in_bits(target, head, bits: int | None):
    """``head``, or its copy with weights group-quantized to ``bits`` (made once per target,
    head and bits, kept as long as the target is). ``bits`` None: 8 where the native kernels
    run the products (a draft step streams a quarter of the bytes), else float32 (MLX's own
    CPU quantized product would cost more than it saves)."""
    from ..kernels.backend import native_enabled
    from .eagle3 import quantized_head

    if bits is None:
        bits = 8 if native_enabled() else 0
    if not bits:
        return head
    made = _quantized.setdefault(target, {})
    key = (id(head), bits)  # the float head is held in the value: its id is not reused
    if key not in made:
        made[key] = (head, quantized_head(head, bits))
    return made[key][1]
