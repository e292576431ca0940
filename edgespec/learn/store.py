"""The record store: what decoding for a user left behind, on disk, bounded and crash-safe.

One record is one generation (a chat turn, a server request): a folder under
``<learn dir>/records/`` holding

- ``aux.npy``    float16 (T, len(aux_layers) * H): the target's hidden states entering the
                 EAGLE-3 feature layers at T consecutive positions of the sequence;
- ``tokens.npy`` int32 (T + 1): the token at each of those positions, then the token after the
                 last one (so every row has its next token);
- ``meta.json``  the prompt's token ids, where the rows start in the sequence (``first``), the
                 row of the prompt's last token (``answer_row``: rows from there on predict the
                 answer), the answer's length, the layers, the surface and the time.

**Crash-safe by construction**: a record is written into a hidden temporary folder and renamed
into place in one step, so a killed process leaves either a whole record or a hidden folder that
is never read (and is removed once it is an hour old); a record that cannot be read (a disk
error, a hand edit) is skipped by readers, never fatal. Names start with the time in
nanoseconds, so name order is age order.

**Bounded**: after each write the oldest records are deleted until the store is within its
byte budget. The folder and its files are private to the user (mode 0700 / 0600).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_BUDGET_MB = 1024
STALE_S = 3600  # a temporary folder this old belongs to a process that died


@dataclass(frozen=True)
class Record:
    """A stored record's name, folder, metadata and size on disk."""

    name: str
    path: Path
    meta: dict
    bytes: int

    @property
    def rows(self) -> int:
        return int(self.meta["rows"])

    @property
    def answer_tokens(self) -> int:
        return int(self.meta["answer_tokens"])

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(aux (T, F) float16, memory-mapped; tokens (T + 1,) int32)."""
        return (np.load(self.path / "aux.npy", mmap_mode="r"),
                np.load(self.path / "tokens.npy"))


def private_dir(path: Path) -> Path:
    """``path`` made and readable by this user alone; so is every missing folder above it that
    this makes (``mkdir(parents=True)`` would leave those open to everyone: a model's learn
    folder, the learn root)."""
    missing = []
    at = path
    while not at.exists():
        missing.append(at)
        at = at.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
    os.chmod(path, 0o700)
    return path


class RecordStore:
    """The records of one target (``folder``), kept within ``budget_bytes``."""

    def __init__(self, folder: Path, budget_bytes: int = DEFAULT_BUDGET_MB * 2**20):
        self.folder = Path(folder)
        self.budget_bytes = int(budget_bytes)

    # ---- writing -------------------------------------------------------------------------

    def add(self, aux: np.ndarray, tokens: np.ndarray, meta: dict) -> Record | None:
        """Write one record (whole, or not at all), then evict the oldest past the budget.
        A record larger than the whole budget is not kept (None)."""
        size = aux.nbytes + tokens.nbytes
        if size > self.budget_bytes:
            return None
        private_dir(self.folder)
        name = f"{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp = self.folder / f".tmp-{name}"
        tmp.mkdir(mode=0o700)
        try:
            for file, arr in (("aux.npy", aux), ("tokens.npy", tokens)):
                with open(tmp / file, "wb", opener=_private_opener) as f:
                    np.save(f, arr)
            meta = {**meta, "rows": int(aux.shape[0])}
            with open(tmp / "meta.json", "w", opener=_private_opener) as f:
                json.dump(meta, f)
            os.replace(tmp, self.folder / name)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.evict()
        return self._read(self.folder / name)

    def evict(self) -> int:
        """Delete the oldest records until the store fits its budget; how many went."""
        records = self.records()
        total, gone = sum(r.bytes for r in records), 0
        for r in records:
            if total <= self.budget_bytes:
                break
            shutil.rmtree(r.path, ignore_errors=True)
            total -= r.bytes
            gone += 1
        return gone

    def remove(self, names) -> None:
        for name in names:
            shutil.rmtree(self.folder / name, ignore_errors=True)

    # ---- reading -------------------------------------------------------------------------

    def records(self) -> list[Record]:
        """Every readable record, oldest first (stale temporary folders are cleared)."""
        if not self.folder.is_dir():
            return []
        out = []
        for path in sorted(self.folder.iterdir()):
            if path.name.startswith(".tmp-"):
                _clear_if_stale(path)
                continue
            rec = self._read(path)
            if rec is not None:
                out.append(rec)
        return out

    @staticmethod
    def _read(path: Path) -> Record | None:
        try:
            meta = json.loads((path / "meta.json").read_text())
            size = sum(f.stat().st_size for f in path.iterdir())
            if not {"rows", "answer_row", "prompt_ids"} <= set(meta):
                return None
        except (OSError, ValueError):
            return None
        return Record(path.name, path, meta, size)

    def bytes(self) -> int:
        return sum(r.bytes for r in self.records())


def _private_opener(path, flags):
    return os.open(path, flags, 0o600)


def _clear_if_stale(path: Path) -> None:
    try:
        if time.time() - path.stat().st_mtime > STALE_S:
            shutil.rmtree(path, ignore_errors=True)
    except OSError:
        pass
