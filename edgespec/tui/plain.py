"""Line-based chat for pipes and minimal terminals (``edgespec chat --plain``, or automatically when
stdin or stdout is not a terminal).

Each input line is a message (end a line with ``\\`` to continue it on the next); ``/help`` lists
the commands. The answer streams to stdout — accepted-draft tokens in green when colour is on,
the model's exact text otherwise — and a stats line goes to stderr. Ctrl+C stops an answer;
Ctrl+C at the prompt or end of input ends the chat.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from typing import TextIO

from ..errors import EdgespecError
from ..generation_defaults import describe
from ..stats import phrase
from .render import ansi
from .session import ChatSession, Update

COMMANDS = {
    "/new": "start a new conversation",
    "/method NAME": "switch the drafting method",
    "/temp T": "set the sampling temperature",
    "/measure": "measure plain decoding speed (for the speedup figure)",
    "/help": "this list",
    "/quit": "leave (or end of input, Ctrl+D)",
}


def stats_line(update: Update | None, session: ChatSession) -> str:
    if update is None:
        return f"[{session.method}] no tokens"
    stopped = ("stopped",) if update.finish_reason == "cancelled" else ()
    return update.stats.summary(update.speedup, *stopped)


class PlainChat:
    """Reads messages from ``stdin`` and streams answers to ``stdout``."""

    def __init__(self, session: ChatSession, stdin: TextIO, stdout: TextIO, stderr: TextIO,
                 color: bool, interactive: bool):
        self.session = session
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.color, self.interactive = color, interactive

    def run(self) -> int:
        while (message := self._read_message()) is not None:
            if message.startswith("/"):
                if not self._command(message):
                    break
            elif message.strip():
                self._answer(message)
        return 0

    def _read_message(self) -> str | None:
        lines = []
        while True:
            if self.interactive:
                self.stderr.write("… " if lines else "> ")
                self.stderr.flush()
            try:
                line = self.stdin.readline()
            except KeyboardInterrupt:
                self.stderr.write("\n")
                return None
            if not line:
                return "\n".join(lines) if lines else None
            line = line.rstrip("\n")
            if line.endswith("\\"):
                lines.append(line[:-1])
                continue
            lines.append(line)
            return "\n".join(lines)

    def _command(self, message: str) -> bool:
        """Run a slash command; False means leave the chat."""
        name, _, arg = message.strip().partition(" ")
        arg = arg.strip()
        try:
            if name == "/quit":
                return False
            if name == "/new":
                self.session.new_conversation()
                self._say("new conversation")
            elif name == "/method":
                self.session.set_method(arg)
                self._say(f"method: {arg}")
            elif name == "/temp":
                self.session.set_temperature(_number(arg))
                self._say(f"temperature: {self.session.sampling.temperature:g}")
            elif name == "/measure":
                self._say("plain decoding: " + phrase("tokens_per_s", self.session.measure_plain()))
            else:
                self._say("commands: " + "; ".join(f"{k}: {v}" for k, v in COMMANDS.items()))
        except EdgespecError as e:
            self._say(f"error: {e}")
        return True

    def _answer(self, message: str) -> None:
        last = None
        with _StopOnSigint(self.session.stop):
            try:
                for update in self.session.reply(message):
                    self.stdout.write(ansi(update.segments, self.color))
                    self.stdout.flush()
                    last = update
            except EdgespecError as e:
                self._say(f"error: {e}")
                return
        self.stdout.write("\n")
        self.stdout.flush()
        self._say(stats_line(last, self.session))

    def _say(self, text: str) -> None:
        self.stderr.write(text + "\n")
        self.stderr.flush()


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise EdgespecError(f"/temp needs a number, e.g. /temp 0.7; got {text!r}") from None


class _StopOnSigint:
    """While active, the first Ctrl+C calls ``stop`` instead of raising KeyboardInterrupt."""

    def __init__(self, stop: Callable[[], None]):
        self.stop = stop
        self.previous = None

    def _handle(self, signum, frame) -> None:
        signal.signal(signal.SIGINT, self.previous)  # a second Ctrl+C interrupts as usual
        self.stop()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def run_plain(load: Callable[[], ChatSession], *, color: bool, stdin: TextIO | None = None,
              stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Load the session (progress on stderr) and chat line by line; returns the exit status."""
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    session = load()
    try:
        interactive = stdin.isatty()
        if interactive:
            stderr.write(f"edgespec chat · {session.target.name} · method {session.method} · "
                         f"{describe(vars(session.sampling))} · /help for commands, Ctrl+D to "
                         "leave\n")
        return PlainChat(session, stdin, stdout, stderr, color, interactive).run()
    finally:
        session.close()  # the worker ends and releases its MLX state
