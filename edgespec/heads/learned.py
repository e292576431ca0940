"""Where a target's learned heads live, and which one is in use (the read side of ``learn/``).

Everything edgespec learns from its user for one target lives under
``learn_root() / <target fingerprint>``: ``learn_root()`` is ``$EDGESPEC_LEARN_DIR``, else
``<cache>/learn``. In that folder ``heads/current.json`` maps a head kind (``eagle3``,
``corpus``) to the version folder in use (``heads/<kind>-vNNNN``); it is replaced atomically by
``learn/versions.py``, so a reader sees the old pointer or the new one, never half of either.
A pointer naming a folder that is gone (deleted by hand) counts as no learned head.

``resolve_alias(alias, target, kind)`` turns the names a comparison uses into a head folder:
``shipped`` (the head found without learned heads: ``$EDGESPEC_HEADS`` or the shipped one),
``learned`` (the one in use from learning; ConfigError when there is none) or a path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import ConfigError
from ..loading.hub import cache_dir
from .config import fingerprint


def learn_root() -> Path:
    """The folder all learned data lives in: ``$EDGESPEC_LEARN_DIR`` or ``<cache>/learn``."""
    env = os.environ.get("EDGESPEC_LEARN_DIR")
    return Path(env).expanduser() if env else cache_dir() / "learn"


def target_dir(target_fp: str) -> Path:
    """One target's learned data (records, corpus, heads, training state)."""
    return learn_root() / target_fp


def current_pointer(target_fp: str) -> Path:
    return target_dir(target_fp) / "heads" / "current.json"


def read_current(target_fp: str) -> dict[str, str]:
    """kind -> version folder name in use (empty when nothing learned is in use)."""
    try:
        data = json.loads(current_pointer(target_fp).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(data, dict) else {}


def learned_head(target_fp: str, kind: str) -> Path | None:
    """The learned ``kind`` head in use for the target, or None."""
    name = read_current(target_fp).get(kind)
    if not name:
        return None
    path = target_dir(target_fp) / "heads" / name
    return path if (path / "config.json").is_file() else None


def resolve_alias(alias: str, target, kind: str) -> Path:
    """``shipped`` / ``learned`` / a head folder path -> the head folder (see the module doc)."""
    from .find import find_head

    if alias == "shipped":
        path = find_head(target, kind, learned=False)
        if path is None:
            raise ConfigError(f"no shipped {kind} head for model {target.name}; "
                              f"`edgespec train {kind}` makes one")
        return path
    if alias == "learned":
        path = learned_head(fingerprint(target), kind)
        if path is None:
            raise ConfigError(f"no learned {kind} head is in use for model {target.name}; "
                              "`edgespec learn run` makes one (see `edgespec learn status`)")
        return path
    path = Path(alias).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(f"head {alias!r} is not a head directory (no config.json); give "
                          "'shipped', 'learned' or a head folder")
    return path
