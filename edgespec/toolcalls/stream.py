"""Model text -> content and tool calls, incrementally: one machine for streamed and whole answers.

Contract. :class:`CallReader` is fed the answer's text in pieces (``feed``) and told when it
ends (``finish``); each returns the newly decided pieces: content text (``str``) and calls
(:class:`~edgespec.toolcalls.parse.Call`). What it returns in total depends only on the whole
text, never on how it was cut (a whole answer is one ``feed``): streamed calls reassemble to
exactly the non-streamed ones.

- Text that may still become a call marker is held back; so is trailing whitespace, which is
  dropped when a call follows it (the content before a call has no dangling newline).
- A marker whose region turns out not to be a call (malformed, or cut by the token limit) is
  released as content, unchanged.
- With ``parallel=False`` only the first call is kept; the text of later calls is dropped.
"""

from __future__ import annotations

from .parse import INVALID, Call
from .syntax import Syntax

Piece = str | Call


class CallReader:
    def __init__(self, syntax: Syntax, parallel: bool = True):
        self.syntax = syntax
        self.parallel = parallel
        self.calls = 0  # calls read so far (kept or not)
        self._buf = ""
        self._boundary = True  # at the answer's start or right after a call: openers count
        self._space = ""  # trailing whitespace held back

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[Piece]:
        out = self._run(final=True)
        if self._buf or (self._space and not self.calls):
            out.append(self._space + self._buf)
        self._buf = self._space = ""
        return [p for p in out if p != ""]

    # -- the machine ----------------------------------------------------------------------------

    def _run(self, final: bool) -> list[Piece]:
        out: list[Piece] = []
        while self._buf:
            if self._boundary:
                step = self._at_boundary(final)
            else:
                step = self._in_text(final, out)
            if step is None:
                break
            out.extend(step)
        return out

    def _at_boundary(self, final: bool) -> list[Piece] | None:
        """Whitespace (and separators after a call) then maybe an opener; None: wait."""
        skip = " \t\r\n" + (self.syntax.separators if self.calls else "")
        rest = self._buf.lstrip(skip)
        if not rest:
            if not final:
                return None
            if self.calls:  # whitespace after the last call is not content
                self._buf = ""
            return self._leave_boundary()
        starts = self.syntax.leading + self.syntax.markers
        if any(rest.startswith(m) for m in starts):
            found = self.syntax.read(rest, final)
            if found is None:
                return None
            if found != INVALID:
                self._buf = rest
                return self._take(*found)
        elif not final and any(m.startswith(rest) for m in starts):
            return None
        return self._leave_boundary()

    def _leave_boundary(self) -> list[Piece]:
        self._boundary = False
        return []

    def _in_text(self, final: bool, out: list[Piece]) -> list[Piece] | None:
        buf = self._buf
        hits = [(buf.find(m), m) for m in self.syntax.markers if m in buf]
        if hits:
            i, marker = min(hits)
            found = self.syntax.read(buf[i:], final)
            if found is None:
                self._buf = buf[i:]
                return self._content(buf[:i]) or None
            if found == INVALID:
                self._buf = buf[i + len(marker):]
                return self._content(buf[:i + len(marker)], hold=False)
            self._buf = buf[i:]
            before = self._content(buf[:i])
            self._space = ""  # whitespace right before a call is dropped
            return before + self._take(*found)
        keep = 0 if final else _partial_marker(buf, self.syntax.markers)
        self._buf = buf[len(buf) - keep:]
        return self._content(buf[:len(buf) - keep]) or None

    def _content(self, text: str, hold: bool = True) -> list[Piece]:
        """Release ``text`` after the held whitespace, holding its own trailing whitespace."""
        if not text:
            return []
        text = self._space + text
        body = text.rstrip() if hold else text
        self._space = text[len(body):]
        return [body] if body else []

    def _take(self, calls: list[Call], end: int) -> list[Piece]:
        self._buf = self._buf[end:]
        self._boundary = True
        kept = calls if self.parallel else calls[:max(0, 1 - self.calls)]
        self.calls += len(calls)
        return list(kept)


def _partial_marker(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that begins some marker."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


def read_all(syntax: Syntax, text: str, parallel: bool = True) -> tuple[str | None, list[Call]]:
    """The whole answer's content (None when there is none) and calls."""
    reader = CallReader(syntax, parallel)
    pieces = reader.feed(text) + reader.finish()
    content = "".join(p for p in pieces if isinstance(p, str))
    return content or None, [p for p in pieces if isinstance(p, Call)]
