"""Recording while decoding: the engine's tap that keeps what EAGLE-3 training needs.

Contract: an ``Engine`` given a :class:`Recorder` asks it, for each generation, for a
:class:`Recording` (``begin(prompt_ids, start)``), makes its target forwards also capture the
recorder's ``layers`` (the EAGLE-3 feature layers), and shows the recording the prefill's rows
(``prompt``) and each step's committed path (``step``): the positions the engine commits anyway,
nothing more is computed. ``end()`` hands the rows to a writer thread, which puts them in the
:class:`~edgespec.learn.store.RecordStore`; the decoding never waits for the disk. A generation
that fails inside the engine is not recorded; one that is closed (cancelled, its client gone, or
the forward its scheduler ran failed) keeps what it committed, every row of which is right.
Drafters that score through the target's lower layers (early exit, layer skip) capture no
feature layers, so their generations are not recorded.

What a step costs the decoding: copying the path's rows of three captured arrays (already
computed for verification) to float16 host memory, on the host alone; the prompt keeps at most
``PROMPT_ROWS`` rows before the answer (the head's attention context in training) and a record
at most ``MAX_ROWS`` rows, so a long conversation cannot fill the store in one go.
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading

import numpy as np

from .store import RecordStore

log = logging.getLogger("edgespec.learn")
PROMPT_ROWS = 512
MAX_ROWS = 4096


class Recording:
    """One generation's rows, kept on the host until ``end``."""

    def __init__(self, recorder: Recorder, prompt_ids: list[int], start: int):
        self.recorder, self.prompt_ids, self.start = recorder, list(prompt_ids), start
        self.parts: list[np.ndarray] = []
        self.tokens: list[int] = []  # the token at each recorded row
        self.first = start  # sequence position of row 0
        self.rows = 0
        self.failed = False
        self.full = False

    def _rows(self, out, rows) -> np.ndarray | None:
        """The captured layers' ``rows``, side by side, float16. Read on the host from arrays
        the forward has computed: no MLX operation is queued, so a pipelined forward already in
        flight is not waited for."""
        captured = out.captured
        if any(i not in captured for i in self.recorder.layers):
            return None
        parts = [np.asarray(captured[i])[rows] for i in self.recorder.layers]
        return np.concatenate(parts, axis=-1).astype(np.float16)

    def prompt(self, out) -> None:
        """The prefill's rows: positions ``start .. len(prompt_ids) - 2`` (the last prompt token
        is the first step's root). Only the last ``PROMPT_ROWS`` are kept."""
        n = out.captured[self.recorder.layers[0]].shape[0] if out is not None else 0
        keep = min(n, PROMPT_ROWS)
        if keep:
            rows = self._rows(out, slice(n - keep, n))
            if rows is None:
                self.failed = True
                return
            self.parts.append(rows)
        self.first = len(self.prompt_ids) - 1 - keep
        self.tokens = self.prompt_ids[self.first : len(self.prompt_ids) - 1]
        self.rows = keep
        self.root = self.prompt_ids[-1]

    def step(self, out, path: list[int], tokens: list[int]) -> None:
        """A step's committed path (tree rows ``path``: the root and the accepted drafts) and
        the tokens it committed (the accepted drafts and the bonus)."""
        if self.failed or self.full or self.rows + len(path) > MAX_ROWS:
            self.full = True  # the rows stop here: later ones would leave a gap
            return
        rows = self._rows(out, np.asarray(path))
        if rows is None:
            self.failed = True
            return
        self.parts.append(rows)
        self.tokens.append(self.root)
        self.tokens.extend(tokens[:-1])
        self.root = tokens[-1]
        self.rows += len(path)

    def end(self, surface_meta: dict | None = None) -> None:
        """Queue the record for writing (nothing when no answer row was recorded)."""
        answer_row = len(self.prompt_ids) - 1 - self.first
        if self.failed or self.rows <= answer_row:
            return
        aux = np.concatenate(self.parts)
        tokens = np.asarray(self.tokens + [self.root], dtype=np.int32)
        meta = {"version": 1, "prompt_ids": self.prompt_ids, "first": self.first,
                "answer_row": answer_row, "answer_tokens": self.rows - answer_row,
                "aux_layers": list(self.recorder.layers), "surface": self.recorder.surface,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"), **(surface_meta or {})}
        self.recorder.write(aux, tokens, meta)


class Recorder:
    """Makes each generation's :class:`Recording` and writes finished ones on its own thread."""

    def __init__(self, store: RecordStore, layers: tuple[int, ...], surface: str):
        self.store, self.layers, self.surface = store, tuple(layers), surface
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.written = self.dropped = 0
        self.on_write = None  # called (on the writer thread) after each record is written

    def begin(self, prompt_ids: list[int], start: int) -> Recording:
        return Recording(self, prompt_ids, start)

    def write(self, aux: np.ndarray, tokens: np.ndarray, meta: dict) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="edgespec-learn-writer",
                                                daemon=True)
                self._thread.start()
        self._queue.put((aux, tokens, meta))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                try:
                    kept = self.store.add(*item)
                except OSError as e:  # a full disk must not stop decoding: say it once a record
                    log.warning("learning: could not write a record to %s: %s", self.store.folder, e)
                    kept = None
                self.written += kept is not None
                self.dropped += kept is None
                if kept is not None and self.on_write is not None:
                    self.on_write(kept)
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until every queued record is written (or dropped)."""
        self._queue.join()

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                self._queue.put(None)
                self._thread.join()
            self._thread = None
