"""Modal screens of the chat app: the key help, and the temperature prompt."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from .render import DRAFTED_STYLE, TARGET_STYLE

KEYS = (
    ("Enter", "send the message"),
    ("Shift+Enter, Ctrl+J, Alt+Enter", "new line in the message"),
    ("Escape, Ctrl+C", "stop the answer being generated (keeps what is there)"),
    ("Ctrl+N", "new conversation"),
    ("Ctrl+T", "show / hide the token colours"),
    ("Ctrl+P", "command palette: method, temperature, plain-speed measurement, …"),
    ("F1", "this help"),
    ("Ctrl+Q", "quit"),
)


def help_table() -> Table:
    table = Table(box=None, show_header=False, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for key, what in KEYS:
        table.add_row(key, what)
    return table


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: 100; max-width: 100%; height: auto; max-height: 100%;
                            padding: 1 2; border: round $primary; background: $surface; }
    """
    BINDINGS = [Binding("escape,f1,q,enter", "dismiss", "Close")]

    def compose(self):
        with Vertical():
            yield Static(Text("edgespec chat — keys", style="bold"))
            yield Static(help_table())
            yield Static(Text.assemble(
                "\nIn answers, ", ("this style", DRAFTED_STYLE), " marks tokens a drafter proposed "
                "and the target accepted; ", ("this one", TARGET_STYLE), " marks the token the "
                "target produced itself at each step (the bonus or corrected token). The status "
                "bar shows τ (tokens per target forward), the acceptance rate and, once a plain "
                "turn has run (or Ctrl+P › Measure plain speed), the speedup over plain decoding."
                "\n\nEscape closes this help."))


class TemperatureScreen(ModalScreen[float | None]):
    """Ask for a temperature; dismisses with the number, or None when cancelled."""

    DEFAULT_CSS = """
    TemperatureScreen { align: center middle; }
    TemperatureScreen > Vertical { width: 50; height: auto; padding: 1 2;
                                   border: round $primary; background: $surface; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: float) -> None:
        super().__init__()
        self.current = current

    def compose(self):
        with Vertical():
            yield Static("Temperature (0 = greedy; Enter to apply, Escape to cancel)")
            yield Input(value=f"{self.current:g}", id="temperature")
            yield Static(id="temperature-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            value = float(event.value)
        except ValueError:
            self.query_one("#temperature-error", Static).update(
                Text(f"not a number: {event.value!r}", style="red"))
            return
        self.dismiss(value)

    def action_cancel(self) -> None:
        self.dismiss(None)
