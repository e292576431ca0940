"""Versioned learned heads: which one is in use, which lost, and going back.

Contract (folder layout in ``heads/learned.py``): a candidate head is written to a hidden folder
under ``heads/`` and then either **promoted** (renamed to ``<kind>-vNNNN``, made current) or
**rejected** (renamed to ``rejected/<kind>-vNNNN``: kept aside with its numbers, never used).
Every folder holds ``learned.json``: what it was trained from and what the guard measured.
``current.json`` (kind -> version in use) is replaced atomically; ``history.json`` lists every
decision, oldest first. ``rollback(kind)`` makes the version that was in use before the current
one current again (or none: the shipped head), and keeps the rolled-back folder on disk with the
rollback noted; rolling back again goes one version further back. ``prune`` deletes old
promoted versions (the corpus keeps the one in use and the one before it).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
from pathlib import Path

from ..errors import ConfigError
from ..heads.learned import current_pointer, read_current, target_dir
from ..training.features import write_json
from .store import private_dir

KEEP_REJECTED = 3
_VERSION = re.compile(r"^(?P<kind>[a-z0-9]+)-v(?P<n>\d{4,})$")


def heads_dir(fp: str) -> Path:
    return target_dir(fp) / "heads"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def history(fp: str) -> list[dict]:
    try:
        data = json.loads((heads_dir(fp) / "history.json").read_text())
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


def _log(fp: str, event: dict) -> None:
    write_json(heads_dir(fp) / "history.json", [*history(fp), {"time": _now(), **event}])


def candidate_dir(fp: str, kind: str) -> Path:
    """An empty hidden folder for a candidate ``kind`` head."""
    path = private_dir(heads_dir(fp)) / f".candidate-{kind}-{os.getpid()}"
    shutil.rmtree(path, ignore_errors=True)
    return path


def _next_name(fp: str, kind: str) -> str:
    found = [int(m["n"]) for d in (heads_dir(fp), heads_dir(fp) / "rejected") if d.is_dir()
             for p in d.iterdir() if (m := _VERSION.match(p.name)) and m["kind"] == kind]
    return f"{kind}-v{max(found, default=0) + 1:04d}"


def _settle(fp: str, kind: str, candidate: Path, info: dict, where: Path) -> Path:
    name = _next_name(fp, kind)
    (candidate / "learned.json").write_text(json.dumps(info, indent=1))
    private_dir(where)
    final = where / name
    os.replace(candidate, final)
    return final


def promote(fp: str, kind: str, candidate: Path, info: dict) -> Path:
    """Make the candidate the ``kind`` head in use; returns its version folder."""
    before = read_current(fp).get(kind)
    final = _settle(fp, kind, candidate, info, heads_dir(fp))
    write_json(current_pointer(fp), {**read_current(fp), kind: final.name})
    _log(fp, {"event": "promoted", "kind": kind, "version": final.name, "replaced": before,
              "why": info.get("decision")})
    return final


def reject(fp: str, kind: str, candidate: Path, info: dict) -> Path:
    """Keep the candidate aside with its numbers, never used; returns its folder. Only the
    newest ``KEEP_REJECTED`` rejected heads keep their weights; older ones keep their numbers."""
    final = _settle(fp, kind, candidate, info, heads_dir(fp) / "rejected")
    _log(fp, {"event": "rejected", "kind": kind, "version": final.name,
              "why": info.get("decision")})
    older = sorted((int(m["n"]), p) for p in final.parent.iterdir()
                   if (m := _VERSION.match(p.name)) and m["kind"] == kind)
    for _, p in older[: max(0, len(older) - KEEP_REJECTED)]:
        for weights in p.glob("*.safetensors"):
            weights.unlink()
    return final


def rollback(fp: str, kind: str) -> tuple[str | None, str | None]:
    """(the version left, the version now in use: None means the shipped head)."""
    now = read_current(fp).get(kind)
    if now is None:
        raise ConfigError(f"no learned {kind} head is in use: nothing to roll back (the shipped "
                          "head is in use)")
    back = None
    for event in reversed(history(fp)):  # what ``now`` replaced when it was promoted
        if event.get("event") == "promoted" and event.get("version") == now:
            back = event.get("replaced")
            break
    if back is not None and not (heads_dir(fp) / back / "config.json").is_file():
        back = None  # its folder is gone: the shipped head
    current = {k: v for k, v in read_current(fp).items() if k != kind}
    if back is not None:
        current[kind] = back
    write_json(current_pointer(fp), current)
    _log(fp, {"event": "rolled back", "kind": kind, "version": now, "now": back})
    return now, back


def prune(fp: str, kind: str, keep: int) -> None:
    """Delete all but the newest ``keep`` promoted ``kind`` versions (never the one in use)."""
    current = read_current(fp).get(kind)
    found = sorted((int(m["n"]), p) for p in heads_dir(fp).iterdir()
                   if (m := _VERSION.match(p.name)) and m["kind"] == kind)
    for _, p in found[: max(0, len(found) - keep)]:
        if p.name != current:
            shutil.rmtree(p, ignore_errors=True)


def versions(fp: str) -> dict[str, list[dict]]:
    """Every version folder (promoted and rejected) with its ``learned.json``."""
    out: dict[str, list[dict]] = {"promoted": [], "rejected": []}
    for key, d in (("promoted", heads_dir(fp)), ("rejected", heads_dir(fp) / "rejected")):
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            if _VERSION.match(p.name):
                try:
                    info = json.loads((p / "learned.json").read_text())
                except (OSError, ValueError):
                    info = {}
                out[key].append({"version": p.name, "path": str(p), **info})
    return out
