"""The one generation thread: one model, one engine, one queue of jobs (the server, ``LLM`` and
the chat).

Contract:
- All MLX work (loading, drafting, scoring) happens on the worker's own thread; jobs run one at a
  time in arrival order. A job's output depends only on the job: each gets a fresh drafter, and
  the engine's prefix reuse between consecutive jobs is exact, so greedy output equals the same
  request run alone.
- Each job receives ``Step`` events and then exactly one terminal event, ``Done`` or ``Failed``,
  on its own channel: an asyncio queue read on one event loop (:class:`LoopJob`) or a thread-safe
  queue read by one thread (:class:`ThreadJob`). A request with ``live_stats`` gets each step as
  ``Live(step, stats)``: with a copy of the running stats after it (the chat's status bar).
- A :class:`Call` job runs ``fn(engine)`` on the thread, in queue order (the chat builds a
  drafter there to check a method switch, or measures plain decoding): it ends with
  ``Returned(value)`` or ``Failed``. ``call`` / ``acall`` submit one and wait for its value.
- ``Job.cancel()`` may be called from any thread. A job cancelled while queued is skipped; a
  running one stops after its current step (commits happen only after verification, so the
  engine's cache stays consistent) and the drafter is dropped. Either way the job ends with
  ``Done(finish_reason="cancelled")``. An exception in one job becomes that job's ``Failed``;
  the worker lives on.
- ``stop()`` fails every job still queued with ``UnavailableError``: no caller waits forever, and
  ``events`` / ``events_blocking`` / ``batches`` raise it if the worker ends without answering.
- ``start(wait=False)`` returns while the model loads: jobs submitted meanwhile run once it is
  loaded, or end with ``Failed(the loading error)`` (a UI stays responsive while it loads).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import mlx.core as mx

from .config import GenerationConfig, SamplingConfig, SpecConfig
from .drafters import load_draft, make_drafter
from .engine import Engine, Step
from .errors import UnavailableError
from .grammar import Grammar, GrammarRule
from .stats import Stats
from .targets import Target, load

log = logging.getLogger("edgespec.worker")
TICK_S = 1.0  # how often a waiting reader checks that the worker is still alive


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


Loader = Callable[[], tuple[Target, Target | None]]


def loader(model: str | Target, draft: str | Target | None = None, dtype: str | None = None,
           progress: bool = True) -> Loader:
    """What the worker thread runs first: the target, and the draft model (loaded once, checked
    against the target's vocabulary) when one is given; an already loaded model is used as is."""

    def load_models() -> tuple[Target, Target | None]:
        target = load(model, dtype=dtype, progress=progress) if isinstance(model, str) else model
        if isinstance(draft, str):
            return target, load_draft(draft, target, progress=progress)
        return target, draft

    return load_models


class Worker:
    """Owns the engine; ``submit`` queues a job, a single daemon thread runs them."""

    def __init__(self, load: Loader, reuse_prefix: bool = True):
        self._load = load
        self._reuse_prefix = reuse_prefix
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="edgespec-worker", daemon=True)
        self.target: Target | None = None
        self.draft: Target | None = None
        self.busy = False
        self.counts = {"served": 0, "cancelled": 0, "failed": 0}

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, wait: bool = True) -> "Worker":
        """Start the thread; unless ``wait`` is False, wait until the model is loaded and
        re-raise a loading error here (without waiting, queued jobs receive it)."""
        self._thread.start()
        if not wait:
            return self
        self._ready.wait()
        if self._load_error is not None:
            self._thread.join()  # let it release MLX's per-thread state before the process may exit
            raise self._load_error
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Fail every queued job, let the running one finish (its owner may cancel it), end;
        wait ``timeout`` seconds for the thread (None: until it ends, a load in progress too).

        A job that slips in after the drain is not run; its reader notices ``alive`` is False.
        """
        self._stopping = True
        self._fail_queued(UnavailableError("the generation worker is stopping; the request was "
                                           "not run"))
        self._queue.put(None)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def submit(self, job: Job) -> Job:
        if not self.alive:
            raise UnavailableError("the generation worker is stopping; the request was not run")
        self._queue.put(job)
        return job

    # -- reading a job's events ----------------------------------------------------------------

    async def events(self, job: LoopJob, tick: float = TICK_S) -> AsyncIterator[Event | None]:
        """The job's events up to the terminal one, and ``None`` for each ``tick`` spent waiting;
        ``UnavailableError`` if the worker stops without answering."""
        while True:
            try:
                event = await asyncio.wait_for(job.events.get(), tick)
            except asyncio.TimeoutError:
                self._check_alive()
                yield None
                continue
            yield event
            if isinstance(event, _END):
                return

    async def batches(self, job: LoopJob, tick: float = TICK_S) -> AsyncIterator[list[Event]]:
        """The job's events in batches: each one all that had arrived when the reader got to
        it, so a reader that redraws per batch keeps up with any speed of generation."""
        async for event in self.events(job, tick):
            if event is None:
                continue
            batch = [event]
            while not isinstance(batch[-1], _END) and not job.events.empty():
                batch.append(job.events.get_nowait())
            yield batch
            if isinstance(batch[-1], _END):
                return

    def events_blocking(self, job: ThreadJob, tick: float = TICK_S) -> Iterator[Event]:
        """The job's events up to the terminal one, waiting on this thread."""
        while True:
            try:
                event = job.events.get(timeout=tick)
            except queue.Empty:
                self._check_alive()
                continue
            yield event
            if isinstance(event, _END):
                return

    def call(self, fn: Callable[[Engine], object]) -> object:
        """``fn(engine)`` run on the worker's thread after the jobs queued before it: its value,
        or its exception raised here (None if the worker skipped it: cancelled, stopping)."""
        job = self.submit(ThreadJob(Call(fn)))
        for event in self.events_blocking(job):
            pass
        return _returned(event)

    async def acall(self, fn: Callable[[Engine], object]) -> object:
        """``call`` for asyncio: the event loop runs on while the worker is busy."""
        job = self.submit(LoopJob(Call(fn), asyncio.get_running_loop()))
        async for event in self.events(job):
            pass
        return _returned(event)

    def _check_alive(self) -> None:
        if not self._thread.is_alive():
            raise UnavailableError("the generation worker stopped before answering")

    # -- the thread --------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._serve_queue()
        finally:
            # MLX gives each thread its own default stream; destroy this thread's streams before it
            # ends, else one can outlive the thread and abort the process at exit (MLX 0.32:
            # "terminate called without an active exception").
            mx.synchronize()
            mx.clear_streams()

    def _serve_queue(self) -> None:
        try:
            self.target, self.draft = self._load()
            engine = Engine(self.target, reuse_prefix=self._reuse_prefix)
        except BaseException as e:  # noqa: BLE001 - handed to start()'s caller, which re-raises it
            self._load_error = e
            self._stopping = True  # nothing more is taken: what is queued gets the error
            self._ready.set()
            self._fail_queued(e)
            return
        self._ready.set()
        while (job := self._queue.get()) is not None:
            if isinstance(job.request, Call):
                self._call(engine, job)
                continue
            if job.cancelled:  # cancelled while queued
                self.counts["cancelled"] += 1
                job.put(Done(Stats(method=job.request.spec.method), "cancelled"))
                continue
            self.busy = True
            try:
                self._run(engine, job)
            except Exception as e:  # one request's failure must not take the worker down
                log.exception("generation failed")
                self.counts["failed"] += 1
                job.put(Failed(e))
            finally:
                engine.drafter = None  # drop the request's drafter and its KV cache
                self.busy = False

    def _call(self, engine: Engine, job: Job) -> None:
        """A :class:`Call`: its value or its exception goes to its caller (not counted as a
        request served or failed)."""
        if job.cancelled:
            job.put(Done(Stats(), "cancelled"))
            return
        self.busy = True
        try:
            job.put(Returned(job.request.fn(engine)))
        except Exception as e:  # the caller re-raises it; the worker lives on
            job.put(Failed(e))
        finally:
            self.busy = False

    def _run(self, engine: Engine, job: Job) -> None:
        r = job.request
        engine.drafter = make_drafter(r.spec, engine.target, r.sampling, draft=self.draft,
                                      prediction=r.prediction)
        rules = GrammarRule(r.grammar, engine.target.tokenizer) if r.grammar else None
        stream = engine.stream(r.prompt, generation=r.generation, sampling=r.sampling,
                               rules=rules, logprobs=r.logprobs)
        try:
            for step in stream:
                job.put(Live(step, copy.copy(engine.last_stats)) if r.live_stats else step)
                reason = step.finish_reason
                if reason is None and job.cancelled:
                    reason = "cancelled"
                if reason is not None:
                    self.counts["cancelled" if reason == "cancelled" else "served"] += 1
                    job.put(Done(engine.last_stats, reason))
                    return
        finally:
            stream.close()  # ends the engine's generator cleanly (also after a cancel)

    def _fail_queued(self, error: BaseException) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.put(Failed(error))


def _returned(event: Event) -> object:
    """A call's value from its terminal event (re-raising its failure)."""
    if isinstance(event, Failed):
        raise event.error
    return event.value if isinstance(event, Returned) else None
