"""The one generation thread: one model, one engine, one queue of jobs (the server, ``LLM`` and
the chat).

Contract:
- All MLX work (loading, drafting, scoring) happens on the worker's own thread. Generations
  start in arrival order and up to ``max_concurrency`` decode at once (``batch.Batch``: their
  trees scored in shared forwards). A job's output depends only on the job: each gets its own
  drafter, cache (from the engine's prefix store, exact) and random stream, so greedy output
  equals the same request run alone and a seeded one draws the same tokens.
- Each job receives ``Step`` events and then exactly one terminal event, ``Done`` or ``Failed``,
  on its own channel: an asyncio queue read on one event loop (:class:`LoopJob`) or a thread-safe
  queue read by one thread (:class:`ThreadJob`). A request with ``live_stats`` gets each step as
  ``Live(step, stats)``: with a copy of the running stats after it (the chat's status bar).
- A :class:`Call` job runs ``fn(engine)`` on the thread, in queue order, once the generations
  started before it have ended (the chat builds a
  drafter there to check a method switch, or measures plain decoding): it ends with
  ``Returned(value)`` or ``Failed``. ``call`` / ``acall`` submit one and wait for its value.
- ``Job.cancel()`` may be called from any thread. A job cancelled while queued is skipped; a
  running one is dropped from the batch at the next round (commits happen only after
  verification, so its cache stays consistent) with its drafter. Either way the job ends with
  ``Done(finish_reason="cancelled")``. An exception in one job becomes that job's ``Failed``;
  the worker lives on.
- ``stop()`` fails every job still queued with ``UnavailableError`` and lets the running ones
  finish: no caller waits forever, and
  ``events`` / ``events_blocking`` / ``batches`` raise it if the worker ends without answering.
- ``start(wait=False)`` returns while the model loads: jobs submitted meanwhile run once it is
  loaded, or end with ``Failed(the loading error)``, and ``submit`` raises the loading error
  once it is known (a UI stays responsive while it loads).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial

import mlx.core as mx

from .drafters import load_draft, make_drafter
from .batch import POLICIES, Batch, Crashed, Ended
from .jobs import (  # noqa: F401  (the worker's job types, imported from here by its callers)
    _END, Call, Done, Event, Failed, GenRequest, Job, Live, LoopJob, Returned, ThreadJob)
from .engine import PREFIX_BUDGET_BYTES, Decoding, Engine
from .kv_budget import kv_bytes
from .errors import ConfigError, QueueFullError, UnavailableError
from .grammar import GrammarRule
from .stats import Stats
from .targets import Target, load

log = logging.getLogger("edgespec.worker")
TICK_S = 1.0  # how often a waiting reader checks that the worker is still alive


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
    """Owns the engine; ``submit`` queues a job, a single daemon thread runs them, up to
    ``max_concurrency`` generations at once (``batch.Batch``); at most ``max_queue`` jobs wait
    (``submit`` raises QueueFullError past that). ``batch_policy``: how decodings share a
    forward's rows (``batch.POLICIES``)."""

    def __init__(self, load: Loader, reuse_prefix: bool = True, *, max_concurrency: int = 4,
                 max_queue: int = 64, kv_budget_bytes: int | None = None, metrics=None,
                 batch_policy: str = "shared", learning=None):
        if max_concurrency < 1 or max_queue < 0:
            raise ConfigError(f"max_concurrency must be >= 1 and max_queue >= 0; got "
                              f"{max_concurrency} and {max_queue}")
        if batch_policy not in POLICIES:
            raise ConfigError(f"batch policy {batch_policy!r}: expected one of "
                              f"{', '.join(POLICIES)}")
        self._load = load
        self._reuse_prefix = reuse_prefix
        self.max_concurrency, self.max_queue = max_concurrency, max_queue
        self.kv_budget_bytes = kv_budget_bytes
        self._kv_per_token: dict[bool, int] = {}  # set once the model is loaded
        self.metrics = metrics
        self.batch_policy = batch_policy
        # ``learn.session.Learning``: record what decoding computes; learn while idle
        self.learning = learning
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._next: Job | None = None  # taken from the queue, waiting for the batch to drain
        self._draining = False  # stop() was called: finish what runs, take nothing more
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="edgespec-worker", daemon=True)
        self.target: Target | None = None
        self.draft: Target | None = None
        self.busy = False
        self.active = 0  # generations decoding now
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
        """Fail every queued job, let the running ones finish (their owners may cancel them), end;
        wait ``timeout`` seconds for the thread (None: until it ends, a load in progress too).

        A job that slips in after the drain is not run; its reader notices ``alive`` is False.
        """
        self._stopping = True
        self._fail_queued(UnavailableError("the generation worker is stopping; the request was "
                                           "not run"))
        self._queue.put(None)
        if self.learning is not None:  # idle-time learning stops at its next step (checkpointed)
            self.learning.pause.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def submit(self, job: Job) -> Job:
        if self._load_error is not None:  # the model never loaded: say why, not just "stopping"
            raise self._load_error
        if not self.alive:
            raise UnavailableError("the generation worker is stopping; the request was not run")
        if self.learning is not None:  # idle-time learning stops at its next step
            self.learning.pause.set()
        if isinstance(job.request, GenRequest) and self._queue.qsize() >= self.max_queue:
            raise QueueFullError(
                f"{self._queue.qsize()} requests are already waiting (this server queues at "
                f"most {self.max_queue} beside the {self.max_concurrency} it decodes at once); "
                "retry shortly", retry_after=1)
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
            if self.learning is not None:
                self.learning.close()
            # MLX gives each thread its own default stream; destroy this thread's streams before it
            # ends, else one can outlive the thread and abort the process at exit (MLX 0.32:
            # "terminate called without an active exception").
            mx.synchronize()
            mx.clear_streams()

    def _serve_queue(self) -> None:
        try:
            self.target, self.draft = self._load()
            # one token's KV bytes: in the target's cache, and with the draft model's ('draft')
            self._kv_per_token = {False: kv_bytes(self.target, None, 1),
                                  True: kv_bytes(self.target, self.draft, 1)}
            recorder = self.learning.attach(self.target) if self.learning is not None else None
            engine = Engine(self.target, reuse_prefix=self._reuse_prefix,
                            prefix_budget_bytes=self.kv_budget_bytes or PREFIX_BUDGET_BYTES,
                            recorder=recorder)
        except BaseException as e:  # noqa: BLE001 - handed to start()'s caller, which re-raises it
            self._load_error = e
            self._stopping = True  # nothing more is taken: what is queued gets the error
            self._ready.set()
            self._fail_queued(e)
            return
        self._ready.set()
        batch = Batch(engine.target, partial(_curve, engine.target), self.batch_policy,
                      waiting=lambda: not self._queue.empty())
        running: dict[int, tuple[Job, Decoding]] = {}
        while True:
            if not self._admit(engine, batch, running):
                return
            if running:
                self._round(engine, batch, running)

    def _admit(self, engine: Engine, batch: Batch, running: dict) -> bool:
        """Take queued jobs while there is room: a generation joins the batch, a Call runs once
        the generations started before it have ended. Waits when nothing runs; returns False
        when the worker is to stop."""
        while len(running) < self.max_concurrency and not self._draining:
            job = self._next
            if job is None:
                try:
                    job = self._queue.get(block=not running) if running or not self._learns() \
                        else self._wait_learning()
                except queue.Empty:
                    break
            self._next = None
            if job is None:  # stop: the running generations finish, nothing more is taken
                self._draining = True
                break
            if isinstance(job.request, Call):
                if running:  # after the generations queued before it
                    self._next = job
                    break
                self._call(engine, job)
                continue
            if job.cancelled:  # cancelled while queued
                self.counts["cancelled"] += 1
                job.put(Done(Stats(method=job.request.spec.method), "cancelled"))
                continue
            if running and not self._fits(job, running):  # waits for room in the KV budget
                self._next = job
                break
            try:
                d = self._start(engine, job, running)
            except Exception as e:  # noqa: BLE001 - a request that cannot start fails alone
                log.exception("generation failed to start")
                self.counts["failed"] += 1
                job.put(Failed(e))
                continue
            running[id(d)] = (job, d)
            batch.add(d)
            self._fit_prefixes(engine, running)
            if self.metrics is not None:
                self.metrics.request_started(d.stats.method)
        self.active = len(running)
        self.busy = bool(running)
        return bool(running) or not self._draining

    def _learns(self) -> bool:
        return self.learning is not None and self.learning.when_idle

    def _wait_learning(self) -> Job | None:
        """The next job; while none comes for ``idle_after_s``, learn (``learn.session``)."""
        while True:
            self.learning.pause.clear()  # before waiting: a job submitted from now on pauses
            try:
                return self._queue.get(timeout=self.learning.idle_after_s)
            except queue.Empty:
                self.learning.idle(self.target, self.target.path)

    def _start(self, engine: Engine, job: Job, running: dict) -> Decoding:
        """The job's decoding, with its own drafter; its cache comes from the engine's prefix
        store (the longest prefix of its prompt any finished request left)."""
        r = job.request
        drafter = make_drafter(r.spec, engine.target, r.sampling, draft=self.draft,
                               prediction=r.prediction)
        rules = GrammarRule(r.grammar, engine.target.tokenizer) if r.grammar else None
        return engine.start(r.prompt, generation=r.generation, sampling=r.sampling, rules=rules,
                            logprobs=r.logprobs, drafter=drafter, record=r.record)

    def kv_per_token(self, method: str) -> int:
        """Bytes of KV cache one token takes for a request of ``method`` (the draft model's
        cache too for 'draft'); known once the model is loaded."""
        return self._kv_per_token[method == "draft"]

    def kv_need(self, request: GenRequest) -> int:
        """The KV cache bytes a request may grow to: prompt + max_tokens."""
        tokens = len(request.prompt) + request.generation.max_tokens
        return tokens * self.kv_per_token(request.spec.method)

    def _fits(self, job: Job, running: dict) -> bool:
        """Whether the job's KV cache fits the budget beside the running requests' (no budget:
        always). A job alone always starts: one too large for the whole budget is refused
        before it is queued (the server's 413)."""
        if not self.kv_budget_bytes:
            return True
        used = sum(self.kv_need(j.request) for j, _ in running.values())
        return used + self.kv_need(job.request) <= self.kv_budget_bytes

    def _fit_prefixes(self, engine: Engine, running: dict) -> None:
        """The prefix store keeps what the running requests leave of the KV budget."""
        if self.kv_budget_bytes:
            used = sum(self.kv_need(j.request) for j, _ in running.values())
            engine.prefixes.fit(self.kv_budget_bytes - used)

    def _round(self, engine: Engine, batch: Batch, running: dict) -> None:
        """One step of every running generation; their events go to their jobs."""
        before = len(running)
        for job, d in list(running.values()):
            if job.cancelled:
                batch.drop(d)
                self._finish(running, job, d, Done(d.stats, "cancelled"))
        for d, event in batch.round():
            job = running[id(d)][0]
            if isinstance(event, Crashed):
                log.error("generation failed", exc_info=event.error)
                self._finish(running, job, d, Failed(event.error))
            elif isinstance(event, Ended):
                self._finish(running, job, d, Done(d.stats, "stop"))
            else:
                job.put(Live(event, copy.copy(d.stats)) if job.request.live_stats else event)
                if self.metrics is not None:
                    self.metrics.step(d.stats.method, len(event.token_ids), event.proposed,
                                      event.accepted)
                reason = event.finish_reason
                if reason is None and job.cancelled:
                    reason = "cancelled"
                    batch.drop(d)
                if reason is not None:
                    self._finish(running, job, d, Done(d.stats, reason))
        self.active = len(running)
        self.busy = bool(running)
        if len(running) != before:  # requests ended: the prefix store may keep more
            self._fit_prefixes(engine, running)

    def _finish(self, running: dict, job: Job, d: Decoding, event: Event) -> None:
        if running.pop(id(d), None) is None:
            return
        reason = "failed" if isinstance(event, Failed) else event.finish_reason
        self.counts["served" if reason not in ("failed", "cancelled") else reason] += 1
        if self.metrics is not None:
            self.metrics.prefix(d.stats.cached_tokens, d.stats.prompt_tokens)
            self.metrics.request_finished(d.stats.method, reason, d.stats)
        job.put(event)

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


def _curve(target: Target):
    """The target's verify-cost curve (measured once per machine and cached; ``targets/cost``)
    for sharing rows between decodings; None while it cannot be had."""
    from .targets.cost import verify_cost_curve

    try:
        return verify_cost_curve(target)
    except Exception:  # noqa: BLE001 - without a curve, rows are shared by value alone
        return None
