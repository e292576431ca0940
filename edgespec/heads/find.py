"""Finding a trained head for a target: ``find_head(target, kind)``.

Where it looks, in order: each entry of ``$EDGESPEC_HEADS`` (``os.pathsep``-separated; an entry
is a head directory, or a folder holding ``<kind>/`` or ``*/<kind>/`` head directories), then
the head learned from this user's own use and rolled out (``learned.learned_head``; not with
``learned=False``), then the heads shipped for the demo model: the repository's top-level
``models/*/<kind>/`` in a checkout, ``edgespec/models/*/<kind>/`` in an installed wheel. A
candidate matches when its config.json's ``edgespec`` section has this kind and the target's
fingerprint; only config files are read. Returns the first match, or None.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from .config import fingerprint
from .learned import learned_head

REPO_MODELS = Path(__file__).resolve().parents[2] / "models"
WHEEL_MODELS = Path(__file__).resolve().parents[1] / "models"


def find_head(target, kind: str, learned: bool = True) -> Path | None:
    """The directory of a ``kind`` head trained for ``target``, or None."""
    want = fingerprint(target)
    for candidate in _candidates(kind, learned_head(want, kind) if learned else None):
        ours = _section(candidate)
        if ours.get("kind") == kind and ours.get("target_fingerprint") == want:
            return candidate
    return None


def _candidates(kind: str, learned: Path | None) -> Iterator[Path]:
    roots = [Path(p) for p in os.environ.get("EDGESPEC_HEADS", "").split(os.pathsep) if p]
    for root in [*roots, *([learned] if learned else []), REPO_MODELS, WHEEL_MODELS]:
        if (root / "config.json").is_file():
            yield root
        for sub in (root / kind, *sorted(root.glob(f"*/{kind}"))):
            if (sub / "config.json").is_file():
                yield sub


def _section(head_dir: Path) -> dict:
    try:
        cfg = json.loads((head_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}  # unreadable candidates are skipped: load_head names the problem if one is used
    ours = cfg.get("edgespec") if isinstance(cfg, dict) else None
    return ours if isinstance(ours, dict) else {}


def head_kind(head_dir) -> str | None:
    """The kind a head folder's config.json names in its edgespec section (None: none named;
    published EAGLE-3 and Medusa checkpoints name none)."""
    return _section(Path(head_dir)).get("kind")


def a_head(kind: str) -> str:
    """``kind`` named in a sentence: 'a corpus', 'an eagle3 head', 'a medusa head'."""
    if kind == "corpus":
        return "a corpus"
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} head"
