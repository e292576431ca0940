"""The chat app's widgets: input, messages, the streaming answer, legend, status bar, loading panel.

Widgets only display what they are given; they never touch the session or the engine.
"""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import LoadingIndicator, Static, TextArea

from ..stats import Stats, phrase
from ..stream_text import Segment
from .render import DRAFTED_STYLE, TARGET_STYLE, printable, styled
from .session import merge_segments

NEWLINE_KEYS = ("shift+enter", "ctrl+j", "alt+enter")
"""Keys that insert a new line in the input (Enter sends). Terminals without the kitty keyboard
protocol send Shift+Enter as a plain Enter; Ctrl+J works everywhere."""


class ChatInput(TextArea):
    """A multi-line input: Enter sends, Shift+Enter / Ctrl+J / Alt+Enter starts a new line."""

    DEFAULT_CSS = """
    ChatInput { height: auto; max-height: 10; min-height: 3; border: round $primary 60%; }
    ChatInput:focus { border: round $primary; }
    """

    class Send(Message):
        """The person pressed Enter on a non-empty message."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus",
                         placeholder="Message — Enter sends, Shift+Enter or Ctrl+J for a new line",
                         **kwargs)

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            if self.text.strip():
                self.post_message(self.Send(self.text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)


class UserMessage(Static):
    DEFAULT_CSS = """
    UserMessage { border: round $secondary; padding: 0 1; margin: 1 0 0 0; height: auto; }
    """

    def __init__(self, text: str) -> None:
        super().__init__(Text(printable(text)))
        self.border_title = "you"


class AnswerView(Static):
    """The assistant's answer, growing as segments arrive; styled by where each token came from."""

    DEFAULT_CSS = """
    AnswerView { border: round $success 50%; padding: 0 1; height: auto; }
    AnswerView.error { border: round $error; color: $error; }
    """

    def __init__(self, label: str, colored: bool = True) -> None:
        super().__init__(Text("…", style="dim"))
        self.segments: list[Segment] = []
        self.colored = colored
        self.border_title = label

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.segments)

    def append(self, segments) -> None:
        if segments:
            self.segments = merge_segments([*self.segments, *segments])
            self._redraw()

    def set_colored(self, colored: bool) -> None:
        self.colored = colored
        self._redraw()

    def finish(self, note: str) -> None:
        self.border_subtitle = note
        if not self.segments:
            self.update(Text("(no text)", style="dim italic"))

    def fail(self, message: str) -> None:
        self.add_class("error")
        self.border_subtitle = "error"
        self.update(Text(message))

    def _redraw(self) -> None:
        if self.segments:
            self.update(styled(self.segments, self.colored))


class Legend(Static):
    DEFAULT_CSS = "Legend { height: 1; padding: 0 1; color: $text-muted; }"

    def show(self, colored: bool) -> None:
        if not colored:
            self.update(Text("token colours hidden — Ctrl+T shows which tokens were drafted"))
            return
        self.update(Text.assemble(
            (" drafted, accepted ", DRAFTED_STYLE), "  ", ("produced by the target", TARGET_STYLE),
            " (bonus / corrected token)   Ctrl+T hides colours"))


def status_text(state: str, method: str, temperature: float, stats: Stats | None,
                speedup: float | None, plain_rate: float | None) -> Text:
    """The status line: state, method, temperature, then the live numbers of the current turn."""
    shown = method if stats is None or stats.method == method else f"{stats.method} → {method}"
    parts = [(f" {state} ", "bold reverse"), f" {shown}", f"T {temperature:g}"]
    if stats is not None and stats.generated_tokens:
        parts += stats.parts()
    if speedup is not None:
        parts.append((phrase("speedup", speedup), "bold"))
    elif plain_rate:
        parts.append("plain " + phrase("tokens_per_s", plain_rate))
    else:
        parts.append(("speedup: run a plain turn", "dim"))
    text = Text()
    for i, part in enumerate(parts):
        if i > 1:
            text.append(" │ ", style="dim")
        content, style = part if isinstance(part, tuple) else (part, "")
        text.append(content, style=style)
    return text


class StatusBar(Static):
    DEFAULT_CSS = "StatusBar { height: 1; background: $panel; color: $text; }"


class LoadingPanel(Vertical):
    """Shown while the model loads: what is happening, a spinner, and the latest progress line
    (anything printed meanwhile, e.g. the conversion's progress bar, is captured here)."""

    DEFAULT_CSS = """
    LoadingPanel { height: auto; padding: 1 2; }
    LoadingPanel #loading-what { text-style: bold; }
    LoadingPanel LoadingIndicator { height: 3; }
    LoadingPanel #loading-progress { color: $text-muted; }
    LoadingPanel.failed { border: heavy $error; }
    LoadingPanel.failed #loading-what { color: $error; }
    """

    def compose(self):
        yield Static(id="loading-what")
        yield LoadingIndicator()
        yield Static(id="loading-progress")

    def on_mount(self) -> None:
        self.app.begin_capture_print(self, stdout=True, stderr=True)

    def on_unmount(self) -> None:
        self.app.end_capture_print(self)

    def on_print(self, event: events.Print) -> None:
        lines = [s.strip() for s in event.text.replace("\r", "\n").split("\n")]
        if last := next((s for s in reversed(lines) if s), None):
            self.query_one("#loading-progress", Static).update(Text(printable(last)))

    def say(self, what: str) -> None:
        self.query_one("#loading-what", Static).update(Text(what))

    def fail(self, message: str) -> None:
        self.add_class("failed")
        self.query_one(LoadingIndicator).display = False
        self.say(message)
        self.query_one("#loading-progress", Static).update(Text("press any key to exit"))
