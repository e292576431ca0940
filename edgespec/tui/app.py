"""The Textual chat app: a conversation whose answers show, as they stream, which tokens the target
accepted from the drafter and which it produced itself.

Threads: loading, checking a method switch, generating and measuring run on the session's
generation worker (``worker.Worker``, the server's and the Python API's thread), in turn;
this class awaits them as asyncio tasks on the UI's event loop (Textual workers without threads;
``busy`` says which runs), so only the UI thread changes the screen. An answer arrives in batches
(``ChatSession.areply``): one redraw per batch, whatever the model's speed. Escape cancels the
worker's job after its current step; leaving the app stops the worker, which releases its MLX
state.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from functools import partial

from rich.text import Text
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.reactive import var
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from ..drafters import registry
from ..errors import ContextOverflowError, EdgespecError
from ..generation_defaults import describe as describe_sampling
from ..stats import phrase
from .screens import HelpScreen, TemperatureScreen
from .session import ChatSession, Status, Update
from .widgets import AnswerView, ChatInput, Legend, LoadingPanel, StatusBar, UserMessage, status_text

TEMPERATURES = (0.0, 0.3, 0.7, 1.0)
_FINISH_NOTES = {"cancelled": "stopped", "length": "token limit", "stop": ""}
Opener = Callable[[Status], Awaitable[ChatSession]]
"""Opens the session (``session.aopen_session``); its status lines come from the worker thread."""


class Progress(Message):
    """A line saying what the worker is doing (loading a model, measuring, ...): posted from
    the worker's thread (``post_message`` is thread-safe)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


def describe(error: Exception) -> str:
    """One line for an error shown in the app."""
    if isinstance(error, ContextOverflowError):
        return f"{error} (Ctrl+N starts a new conversation)"
    if isinstance(error, OSError) and error.filename:
        return f"{error.strerror or error}: {error.filename}"
    return str(error)


class ChatApp(App[None]):
    """``edgespec chat``: see the module docstring. ``load_error`` is set when loading failed."""

    TITLE = "edgespec chat"
    CSS = """
    #conversation { height: 1fr; padding: 0 1; }
    #welcome { color: $text-muted; padding: 1 1 0 1; }
    """
    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+c", "interrupt", show=False, priority=True),
        Binding("ctrl+n", "new_conversation", "New chat", priority=True),
        Binding("ctrl+t", "toggle_colors", "Colours"),
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("pageup", "scroll('up')", show=False, priority=True),
        Binding("pagedown", "scroll('down')", show=False, priority=True),
    ]

    busy: var[str | None] = var("loading", bindings=True)
    """The running work: "loading" | "generating" | "measuring", "failed", or None when idle."""

    def __init__(self, opener: Opener, model_label: str):
        super().__init__()
        self.sub_title = model_label
        self.model_label = model_label
        self.session: ChatSession | None = None
        self.colored = True
        self.load_error: str | None = None
        self._opener = opener
        self._pending: str | None = None  # a message sent while the model loads
        self._answer: AnswerView | None = None
        self._last: Update | None = None
        self._note: str | None = None  # a worker's progress line, shown in the status bar
        self._new_after_stop = False

    def compose(self):
        yield Header()
        with VerticalScroll(id="conversation"):
            yield LoadingPanel()
        yield Legend()
        yield ChatInput(id="input")  # usable at once: the first question can be typed while loading
        yield StatusBar()
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(LoadingPanel).say(f"loading {self.model_label}…")
        self.query_one(Legend).show(self.colored)
        self._show_status()
        self.query_one(ChatInput).focus()
        self.run_worker(self._open(), name="load")

    def on_unmount(self) -> None:
        if self.session is not None:
            self.session.close()  # the running job stops after its step; the worker ends

    def _status(self, text: str) -> None:  # called on the worker's thread
        self.post_message(Progress(text))

    # the work, awaited on the UI's event loop -----------------------------------------------------

    async def _open(self) -> None:
        try:
            session = await self._opener(self._status)
        except (EdgespecError, OSError) as e:
            self._load_failed(describe(e))
        else:
            self._loaded(session)

    async def _generate(self, text: str) -> None:
        error = None
        try:
            async for updates in self.session.areply(text, self._status):
                self._show(updates)
        except (EdgespecError, OSError) as e:
            error = describe(e)
        self._work_done(error)

    async def _measure(self) -> None:
        error, rate = None, None
        try:
            rate = await self.session.ameasure_plain()
        except (EdgespecError, OSError) as e:
            error = describe(e)
        self._work_done(error, rate)

    # what the work reports ----------------------------------------------------------------------

    def _loaded(self, session: ChatSession) -> None:
        self.session, self.busy = session, None
        target = self.session.target
        self.query_one(LoadingPanel).remove()
        self.query_one("#conversation").mount(Static(Text(
            f"{target.name}: {target.num_layers} layers, {target.dtype}, context "
            f"{target.context_length} · methods: {', '.join(self.session.methods)}\n"
            f"sampling: {describe_sampling(vars(self.session.sampling))} "
            f"({self.session.sampling_origin})\n"
            "Enter sends · Escape stops the answer · Ctrl+P switches method or temperature · "
            "F1 help"), id="welcome"))
        self._show_status()
        pending, self._pending = self._pending, None
        if pending:  # a message sent while the model was loading goes out now
            self.on_chat_input_send(ChatInput.Send(pending))

    def _load_failed(self, error: str) -> None:
        self.busy, self.load_error = "failed", error
        self.query_one(ChatInput).disabled = True  # so any key reaches on_key and exits
        self.query_one(LoadingPanel).fail(f"could not load {self.model_label}:\n{error}")
        self._show_status()

    def on_progress(self, message: Progress) -> None:
        if self.busy == "loading":
            self.query_one(LoadingPanel).say(message.text)
        else:
            self._note = message.text
            self._show_status()

    def _show(self, updates: list[Update]) -> None:
        if not updates or self._answer is None:
            return
        self._note = None
        for update in updates:
            self._answer.append(update.segments)
        self._last = updates[-1]
        self._show_status()
        self.call_after_refresh(self._follow)

    def _follow(self, jump: bool = False) -> None:
        """Keep the newest text in view once the conversation overflows (anchoring earlier would
        push short conversations to the bottom); ``jump`` re-attaches after the person scrolled."""
        conversation = self.query_one("#conversation", VerticalScroll)
        if conversation.max_scroll_y > 0 and (jump or not conversation.is_anchored):
            conversation.anchor()

    def _work_done(self, error: str | None = None, rate: float | None = None) -> None:
        was, self.busy, self._note = self.busy, None, None
        if was == "generating" and self._answer is not None:
            self._finish_answer(error)
        elif error:
            self.notify(error, severity="error", timeout=8)
        elif was == "measuring":
            self.notify("plain decoding: " + phrase("tokens_per_s", rate))
        if self._new_after_stop:
            self._clear_conversation()
        self._show_status()
        self.query_one(ChatInput).focus()

    def _finish_answer(self, error: str | None) -> None:
        answer, self._answer = self._answer, None
        if error and not answer.segments:
            answer.fail(error)
            return
        if error:
            self.notify(error, severity="error", timeout=8)
        if self._last is not None:
            last = self._last
            note = [_FINISH_NOTES.get(last.finish_reason or "", ""), *last.stats.parts(last.speedup)]
            answer.finish(" · ".join(n for n in note if n))

    # the person's actions ---------------------------------------------------------------------

    def on_chat_input_send(self, message: ChatInput.Send) -> None:
        if self.busy == "loading":
            self._pending = message.text
            self.notify("the model is still loading; your message will be sent when it is ready")
            return
        if self.session is None or self.busy:
            self.notify("wait for the answer to finish, or press Escape to stop it")
            return
        self.query_one(ChatInput).clear()
        conversation = self.query_one("#conversation", VerticalScroll)
        self._answer = AnswerView(f"edgespec · {self.session.method}", self.colored)
        conversation.mount(UserMessage(message.text), self._answer)
        conversation.call_after_refresh(self._follow, True)
        self.busy, self._last = "generating", None
        self._show_status()
        self.run_worker(self._generate(message.text), name="generate")

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        on_main = len(self.screen_stack) == 1
        if action == "stop":  # otherwise Escape goes on to the focused widget
            return on_main and self.busy == "generating"
        if action == "interrupt":  # with text selected in the input, Ctrl+C copies it
            return on_main and not self.query_one(ChatInput).selected_text
        if action in ("new_conversation", "toggle_colors", "help"):
            return on_main and self.session is not None
        return True

    def action_stop(self) -> None:
        if self.session is not None:
            self.session.stop()
            self._note = "stopping…"
            self._show_status()

    def action_interrupt(self) -> None:
        if self.busy == "generating":
            self.action_stop()
        else:
            self.notify("Ctrl+Q quits; Ctrl+C and Escape stop an answer being generated")

    def action_new_conversation(self) -> None:
        if self.busy == "generating":
            self._new_after_stop = True
            self.action_stop()
        elif self.busy is None:
            self._clear_conversation()

    def _clear_conversation(self) -> None:
        self._new_after_stop = False
        self.session.new_conversation()
        conversation = self.query_one("#conversation", VerticalScroll)
        conversation.query("UserMessage, AnswerView").remove()
        conversation.anchor(False)
        self._last = None
        self._show_status()
        self.notify("new conversation")

    def action_toggle_colors(self) -> None:
        self.colored = not self.colored
        for view in self.query(AnswerView):
            view.set_colored(self.colored)
        self.query_one(Legend).show(self.colored)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_scroll(self, direction: str) -> None:
        conversation = self.query_one("#conversation", VerticalScroll)
        if direction == "up":
            conversation.scroll_page_up()
        else:
            conversation.scroll_page_down()

    def action_measure(self) -> None:
        if self.session is None or self.busy:
            self.notify("busy: try again when the answer has finished")
            return
        self.busy, self._note = "measuring", "measuring plain decoding…"
        self._show_status()
        self.run_worker(self._measure(), name="measure")

    def action_ask_temperature(self) -> None:
        if self.session is not None:
            self.push_screen(TemperatureScreen(self.session.sampling.temperature),
                             self.switch_temperature)

    def action_show_sampling(self) -> None:
        if self.session is not None:
            self.notify(f"sampling: {describe_sampling(vars(self.session.sampling))}")

    async def action_quit(self) -> None:
        if self.session is not None:
            self.session.stop()  # the worker ends after its current step
        self.exit(return_code=2 if self.load_error else 0)

    def on_key(self, event) -> None:
        if self.busy == "failed":
            self.exit(return_code=2)

    def switch_method(self, method: str) -> None:
        try:
            self.session.set_method(method)
        except EdgespecError as e:
            self.notify(str(e), severity="error")
            return
        later = " (from the next answer)" if self.busy == "generating" else ""
        self.notify(f"method: {method}{later}")
        self._show_status()

    def switch_temperature(self, temperature: float | None) -> None:
        if temperature is None or self.session is None:
            return
        try:
            self.session.set_temperature(temperature)
        except EdgespecError as e:
            self.notify(str(e), severity="error")
            return
        self.notify(f"temperature: {temperature:g}")
        self._show_status()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        session = self.session
        if session is None:
            return
        for m in session.methods:
            mark = " (current)" if m == session.method else ""
            yield SystemCommand(f"Method: {m}{mark}", registry.get(m).summary,
                                partial(self.switch_method, m))
        for t in TEMPERATURES:
            mark = " (current)" if t == session.sampling.temperature else ""
            yield SystemCommand(f"Temperature: {t:g}{' (greedy)' if t == 0 else ''}{mark}",
                                "sampling temperature from the next answer",
                                partial(self.switch_temperature, t))
        yield SystemCommand("Temperature: other…", "type a temperature", self.action_ask_temperature)
        yield SystemCommand(f"Sampling: {describe_sampling(vars(session.sampling))}",
                            f"active now; what no flag set comes from {session.sampling_origin}",
                            self.action_show_sampling)
        yield SystemCommand("Measure plain speed", "a short plain-decoding run, so the status bar "
                            "can show the speedup", self.action_measure)
        yield SystemCommand("Token colours: " + ("hide" if self.colored else "show"),
                            "toggle the drafted / target styling (Ctrl+T)", self.action_toggle_colors)
        yield SystemCommand("New conversation", "forget the conversation (Ctrl+N)",
                            self.action_new_conversation)
        yield SystemCommand("Help", "keys and what the colours mean (F1)", self.action_help)

    def _show_status(self) -> None:
        bar = self.query_one(StatusBar)
        if self.session is None:
            bar.update(Text(f" {self.busy} ", style="bold reverse"))
            return
        last = self._last
        bar.update(status_text(self._note or self.busy or "ready", self.session.method,
                               self.session.sampling.temperature, last and last.stats,
                               last and last.speedup, self.session.plain_rate))
