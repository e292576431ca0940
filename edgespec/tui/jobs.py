"""The chat app's jobs on the engine thread, and the messages they send back to the UI thread.

Each job is a plain function run on :class:`~edgespec.tui.session.EngineThread`; it reports only
through ``post`` (a Textual ``post_message``, which is thread-safe) and never touches a widget.
Answer updates go through a :class:`Mailbox`, which wakes the UI once per batch: a fast model
cannot flood the UI with redraws and a slow one never holds it up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from textual.message import Message

from ..errors import ContextOverflowError, EdgespecError
from .session import ChatSession

Post = Callable[[Message], object]
Loader = Callable[[Callable[[str], None]], ChatSession]
"""Loads the session on the engine thread; gets a callback for progress lines."""


class Loaded(Message):
    def __init__(self, session: ChatSession) -> None:
        super().__init__()
        self.session = session


class LoadFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class Progress(Message):
    """A line saying what a job is doing (loading a model, a draft model, ...)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class Flush(Message):
    """Answer updates are waiting in the mailbox."""


class JobDone(Message):
    def __init__(self, error: str | None = None, rate: float | None = None) -> None:
        super().__init__()
        self.error = error
        self.rate = rate  # the measured plain-decoding rate (measure job)


class Mailbox:
    """Items handed from the engine thread to the UI thread, with one wake-up per batch."""

    def __init__(self, notify: Callable[[], object]):
        self._notify = notify
        self._lock = threading.Lock()
        self._items: list = []
        self._pending = False

    def put(self, item) -> None:
        with self._lock:
            self._items.append(item)
            if self._pending:
                return
            self._pending = True
        self._notify()

    def take(self) -> list:
        with self._lock:
            items, self._items, self._pending = self._items, [], False
        return items


def describe(error: Exception) -> str:
    """One line for an error shown in the app."""
    if isinstance(error, ContextOverflowError):
        return f"{error} (Ctrl+N starts a new conversation)"
    if isinstance(error, OSError) and error.filename:
        return f"{error.strerror or error}: {error.filename}"
    return str(error)


def load(loader: Loader, post: Post) -> None:
    try:
        session = loader(lambda text: post(Progress(text)))
    except (EdgespecError, OSError) as e:
        post(LoadFailed(describe(e)))
    else:
        post(Loaded(session))


def generate(session: ChatSession, text: str, mailbox: Mailbox, post: Post) -> None:
    error = None
    try:
        session.prepare(lambda line: post(Progress(line)))
        for update in session.reply(text):
            mailbox.put(update)
    except (EdgespecError, OSError) as e:
        error = describe(e)
    finally:
        post(JobDone(error))


def measure(session: ChatSession, post: Post) -> None:
    error, rate = None, None
    try:
        rate = session.measure_plain()
    except (EdgespecError, OSError) as e:
        error = describe(e)
    finally:
        post(JobDone(error, rate))
