"""Committed tokens -> streamed text, with stop strings, in runs that say where the text came from.

Text that could still turn out to be the beginning of a stop string is held back until it is
resolved, so a stream never shows part of a stop string; the text of a finished stream ends
right before the first stop string that occurred.

Every character is attributed to the token whose decoding completed it (a UTF-8 character split
over several byte tokens belongs to the last of them), and ``add`` says whether that token was an
accepted draft. ``take`` and ``flush`` return the released text as :class:`Segment` runs whose
concatenation is exactly that text. Held-back text keeps the attribution of its token and comes
out in the runs of the call that releases it (so a step may carry drafted text from an earlier
step); text only ``flush`` completes (an incomplete UTF-8 sequence, shown as U+FFFD) is the
target's. Bookkeeping is O(1) per token and O(runs) per release: nothing is decoded twice.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from .loading.tokenizer import StreamDecoder, Tokenizer


class Segment(NamedTuple):
    """A run of output text and where it came from."""

    text: str
    drafted: bool  # True: from drafts the target accepted; False: produced by the target itself


class TextStream:
    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = ()):
        self.decoder = StreamDecoder(tokenizer)
        self.stop = tuple(stop)
        self.text = ""
        self.sent = 0  # characters already handed out
        self.stopped = False
        self._runs: deque[list] = deque()  # [end, drafted] runs covering text[sent:], in order

    def add(self, token: int, drafted: bool = False) -> bool:
        """Append a token; True when a stop string has now occurred (the text is cut there)."""
        before = len(self.text)
        self._append(self.decoder.add(token), drafted)
        return self._check_stop(before)

    def _append(self, delta: str, drafted: bool) -> None:
        if not delta:
            return
        self.text += delta
        if self._runs and self._runs[-1][1] == drafted:
            self._runs[-1][0] = len(self.text)
        else:
            self._runs.append([len(self.text), drafted])

    def _check_stop(self, before: int) -> bool:
        if not self.stop or self.stopped:
            return self.stopped
        hits = []
        for s in self.stop:
            i = self.text.find(s, max(0, before - len(s) + 1))
            if i >= 0:
                hits.append(i)
        if hits:
            self.text = self.text[: min(hits)]  # runs past the cut are clipped by _release
            self.stopped = True
        return self.stopped

    def _safe_end(self) -> int:
        """End of the text that cannot be the start of a stop string."""
        end = len(self.text)
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:n]):
                    end = min(end, len(self.text) - n)
                    break
        return max(end, self.sent)

    def _release(self, end: int) -> tuple[Segment, ...]:
        """``text[sent:end]`` as runs; the part of a run past ``end`` stays for the next call."""
        out, start = [], self.sent
        while start < end:
            run_end, drafted = self._runs[0]
            cut = min(run_end, end)
            out.append(Segment(self.text[start:cut], drafted))
            if run_end <= end:
                self._runs.popleft()
            start = cut
        self.sent = end
        return tuple(out)

    def take(self) -> tuple[Segment, ...]:
        """The text that became safe to show since the last call."""
        return self._release(len(self.text) if self.stopped else self._safe_end())

    def flush(self) -> tuple[Segment, ...]:
        """At the end of generation: everything not shown yet (minus any stop string)."""
        if not self.stopped:
            before = len(self.text)
            self._append(self.decoder.flush(), drafted=False)
            self._check_stop(before)
        return self._release(len(self.text))
