"""What the generation worker takes and gives: a job (a generation or a call), its channel,
and the events it receives (``worker.py`` has the contract).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .config import GenerationConfig, SamplingConfig, SpecConfig
from .engine import Engine, Step
from .grammar import Grammar
from .stats import Stats


@dataclass(frozen=True)
class GenRequest:
    """One generation, already validated: token ids and the three config objects."""

    prompt: list[int]
    generation: GenerationConfig
    sampling: SamplingConfig
    spec: SpecConfig
    prediction: tuple[int, ...] | None = None  # predicted output's token ids (drafted first)
    grammar: Grammar | None = None  # structured output: the output must match it
    logprobs: int | None = None  # per token: its log-probability and this many alternatives
    live_stats: bool = False  # each step arrives as Live(step, a copy of the running stats)
    record: bool = True  # recorded for learning, where the worker records (``store: false``: not)


@dataclass(frozen=True)
class Call:
    """Work for the worker's thread other than a generation: ``fn(engine)``, in queue order."""

    fn: Callable[[Engine], object]


@dataclass(frozen=True)
class Live:
    """A step of a ``live_stats`` request, with the generation's stats just after it."""

    step: Step
    stats: Stats


@dataclass(frozen=True)
class Returned:
    """The end of a :class:`Call`: what ``fn`` returned."""

    value: object


@dataclass(frozen=True)
class Done:
    stats: Stats
    finish_reason: str  # "stop" | "length" | "cancelled"


@dataclass(frozen=True)
class Failed:
    error: BaseException


Event = Step | Live | Done | Failed | Returned
_END = (Done, Failed, Returned)  # a job's terminal events


class Job:
    """A queued generation or call; the worker hands its events to ``put`` (a subclass's
    channel)."""

    def __init__(self, request: GenRequest | Call):
        self.request = request
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop the job after its current step, or skip it if it has not started (any thread)."""
        self._cancelled.set()

    def put(self, event: Event) -> None:
        raise NotImplementedError


class LoopJob(Job):
    """A job whose events arrive on ``events``, an asyncio queue of one event loop."""

    def __init__(self, request: GenRequest | Call, loop: asyncio.AbstractEventLoop):
        super().__init__(request)
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self._loop = loop

    def put(self, event: Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop has closed: nobody will read this job again
            self.cancel()


class ThreadJob(Job):
    """A job whose events arrive on ``events``, a queue read by one (blocking) thread."""

    def __init__(self, request: GenRequest | Call):
        super().__init__(request)
        self.events: queue.Queue[Event] = queue.Queue()

    def put(self, event: Event) -> None:
        self.events.put(event)
