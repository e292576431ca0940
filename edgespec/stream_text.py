"""Committed tokens -> streamed text, with stop strings.

Text that could still turn out to be the beginning of a stop string is held back until it is
resolved, so a stream never shows part of a stop string; the text of a finished stream ends
right before the first stop string that occurred.
"""

from __future__ import annotations

from .loading.tokenizer import StreamDecoder, Tokenizer


class TextStream:
    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = ()):
        self.decoder = StreamDecoder(tokenizer)
        self.stop = tuple(stop)
        self.text = ""
        self.sent = 0  # characters already handed out
        self.stopped = False

    def add(self, token: int) -> bool:
        """Append a token; True when a stop string has now occurred (the text is cut there)."""
        before = len(self.text)
        self.text += self.decoder.add(token)
        return self._check_stop(before)

    def _check_stop(self, before: int) -> bool:
        if not self.stop or self.stopped:
            return self.stopped
        hits = []
        for s in self.stop:
            i = self.text.find(s, max(0, before - len(s) + 1))
            if i >= 0:
                hits.append(i)
        if hits:
            self.text = self.text[: min(hits)]
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

    def take(self) -> str:
        """The text that became safe to show since the last call."""
        end = len(self.text) if self.stopped else self._safe_end()
        out, self.sent = self.text[self.sent : end], end
        return out

    def flush(self) -> str:
        """At the end of generation: everything not shown yet (minus any stop string)."""
        if not self.stopped:
            before = len(self.text)
            self.text += self.decoder.flush()
            self._check_stop(before)
        out, self.sent = self.text[self.sent :], len(self.text)
        return out
