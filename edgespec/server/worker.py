"""The one generation thread: one model, one engine, one queue of jobs.

Contract:
- All MLX work (loading, drafting, scoring) happens on the worker's own thread; jobs run one at a
  time in arrival order. A job's output depends only on the job: greedy output equals the same
  request run alone (the engine's prefix reuse between consecutive jobs is exact).
- Each job receives, on its own asyncio queue, ``Step`` events and then exactly one terminal
  event, ``Done`` or ``Failed`` -- unless it was cancelled, since then nobody is listening.
- ``Job.cancel()`` (the client went away) is honoured between steps: the stream is closed, the
  drafter and its cache dropped, and the engine is ready for the next job. A job cancelled while
  queued is skipped. An exception in one job becomes that job's ``Failed``; the worker lives on.
- ``stop()`` fails every job still queued with ``UnavailableError``: no request waits forever.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from ..config import GenerationConfig, SamplingConfig, SpecConfig
from ..drafters import make_drafter
from ..engine import Engine, Step
from ..stats import Stats
from ..targets import Target
from .errors import UnavailableError

log = logging.getLogger("edgespec.server")


@dataclass(frozen=True)
class GenRequest:
    """One generation, already validated: token ids and the three config objects."""

    prompt: list[int]
    generation: GenerationConfig
    sampling: SamplingConfig
    spec: SpecConfig


@dataclass(frozen=True)
class Done:
    stats: Stats
    finish_reason: str  # "stop" | "length"


@dataclass(frozen=True)
class Failed:
    error: BaseException


Event = Step | Done | Failed


class Job:
    """A queued generation and the channel its events come back on (to one event loop)."""

    def __init__(self, request: GenRequest, loop: asyncio.AbstractEventLoop):
        self.request = request
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self._loop = loop
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()

    def put(self, event: Event) -> None:
        """Deliver ``event`` from the worker thread."""
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop has closed: nobody will read this job again
            self.cancel()


Loader = Callable[[], tuple[Target, Target | None]]


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

    def start(self) -> "Worker":
        """Start the thread, wait until the model is loaded; re-raise a loading error here."""
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            self._thread.join()  # let it release MLX's per-thread state before the process may exit
            raise self._load_error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Fail every queued job, let the running one finish (its handler may cancel it), end.

        A job that slips in after the drain is not run; its handler notices ``alive`` is False.
        """
        self._stopping = True
        self._fail_queued()
        self._queue.put(None)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def submit(self, request: GenRequest, loop: asyncio.AbstractEventLoop) -> Job:
        if not self.alive:
            raise UnavailableError("the server is shutting down; the request was not run")
        job = Job(request, loop)
        self._queue.put(job)
        return job

    # -- the thread --------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._serve_queue()
        finally:
            # MLX gives each thread its own default stream; destroy this thread's streams before it
            # ends, else one can outlive the thread and abort the process at exit ("terminate
            # called without an active exception", seen in about 1 of 8 exits without this).
            mx.synchronize()
            mx.clear_streams()

    def _serve_queue(self) -> None:
        try:
            self.target, self.draft = self._load()
            engine = Engine(self.target, reuse_prefix=self._reuse_prefix)
        except BaseException as e:  # noqa: BLE001 - handed to start()'s caller, which re-raises it
            self._load_error = e
            self._ready.set()
            return
        self._ready.set()
        while (job := self._queue.get()) is not None:
            if job.cancelled:  # the client left while the job was queued
                self.counts["cancelled"] += 1
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

    def _run(self, engine: Engine, job: Job) -> None:
        r = job.request
        engine.drafter = make_drafter(r.spec, engine.target, r.sampling, draft=self.draft)
        stream = engine.stream(r.prompt, generation=r.generation, sampling=r.sampling)
        try:
            for step in stream:
                if job.cancelled:
                    self.counts["cancelled"] += 1
                    return
                job.put(step)
                if step.finish_reason is not None:
                    self.counts["served"] += 1
                    job.put(Done(engine.last_stats, step.finish_reason))
        finally:
            stream.close()  # ends the engine's generator cleanly (also after a cancel)

    def _fail_queued(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.put(Failed(UnavailableError("the server is shutting down; the request was not run")))
