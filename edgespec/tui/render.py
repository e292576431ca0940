"""How answer text looks: the two token styles, safe display text, ANSI colour for line mode.

Models can emit any byte, including terminal control characters; text shown on a terminal goes
through :func:`printable` so an answer can never move the cursor or change the terminal's state.
"""

from __future__ import annotations

from rich.text import Text

from ..stream_text import Segment

DRAFTED_STYLE = "#a6f0bd on #1b3a28"
"""Tokens that came from drafts the target accepted."""
TARGET_STYLE = "#f3c677"
"""Tokens the target produced itself: the bonus token, or the correction of a rejected draft."""

_ANSI_DRAFTED, _ANSI_RESET = "\x1b[32m", "\x1b[0m"  # plain green: readable on any terminal

_CONTROL = {c: 0x2400 + c for c in range(0x20) if chr(c) not in "\n\t"}  # U+2400 control pictures
_CONTROL.update({0x7F: 0x2421, **{c: 0xFFFD for c in range(0x80, 0xA0)}})


def printable(text: str) -> str:
    """``text`` with control characters (but newline and tab) replaced by visible symbols."""
    return text.translate(_CONTROL)


def styled(segments, colored: bool = True) -> Text:
    """Answer runs as rich Text, each styled by where its tokens came from (or plain)."""
    out = Text()
    for p in segments:
        style = (DRAFTED_STYLE if p.drafted else TARGET_STYLE) if colored else ""
        out.append(printable(p.text), style=style)
    return out


def ansi(segments: tuple[Segment, ...] | list[Segment], color: bool) -> str:
    """Answer runs for a terminal line: accepted-draft runs in green when ``color``.

    Without colour the text is returned unchanged, so a pipe receives exactly the model's text.
    """
    if not color:
        return "".join(p.text for p in segments)
    return "".join(f"{_ANSI_DRAFTED}{printable(p.text)}{_ANSI_RESET}" if p.drafted
                   else printable(p.text) for p in segments)
