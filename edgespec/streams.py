"""One call's output as it is generated: :class:`Stream` (threads) and :class:`AsyncStream`
(asyncio), both reading a job of the generation thread (``worker.py``).

Contract: iterating yields the call's :class:`~edgespec.engine.Step` events in order, one per
target forward: ``step.text``, ``step.token_ids`` and ``step.segments`` (runs of text marked
``drafted`` when they came from drafts the target accepted). ``result()`` waits for the end and
returns the whole :class:`~edgespec.engine.Result`, built from the same steps. ``cancel()`` may be
called from any thread or task: the call ends after its current step with
``finish_reason == "cancelled"`` (text held back for a possible stop string is dropped), and the
engine's cache stays consistent for the next call. Leaving a loop over the stream early (break,
an exception, Ctrl+C while waiting, cancelling the task that awaits it) or dropping the stream
cancels the call too.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Iterator

from .engine import Result, Step
from .worker import Done, Event, Failed, Job, LoopJob, ThreadJob, Worker


class _Reader:
    """What both streams share: the job, the steps so far, the result once it is done."""

    def __init__(self, job: Job, owner: object):
        self._job = job
        self._owner = owner  # the LLM: kept alive while a stream of it is (closing it cancels)
        self._steps: list[Step] = []
        self._result: Result | None = None
        self._error: BaseException | None = None
        weakref.finalize(self, job.cancel)  # a stream dropped unread does not keep generating

    def cancel(self) -> None:
        """End the call after its current step (safe from any thread or task)."""
        self._job.cancel()

    @property
    def done(self) -> bool:
        """Whether the call has ended and ``result()`` returns without waiting."""
        return self._result is not None

    def _running(self) -> bool:
        """Whether the call is still running; a failed call raises its error (on every read)."""
        if self._error is not None:
            raise self._error
        return self._result is None

    def _take(self, event: Event | None) -> Step | None:
        """The step ``event`` carries; None for a tick spent waiting or the call's end."""
        if isinstance(event, Step):
            self._steps.append(event)
            return event
        if isinstance(event, Done):
            self._result = Result.from_steps(self._steps, event.stats, event.finish_reason)
        elif isinstance(event, Failed):
            self._error = event.error
        return None

    def _stop_unless_done(self) -> None:
        if self._result is None:  # the reader left early (break, an exception): end the call
            self.cancel()


class Stream(_Reader):
    """The steps of one call, for a thread: ``for step in stream: print(step.text, end="")``."""

    def __init__(self, worker: Worker, job: ThreadJob, owner: object = None):
        super().__init__(job, owner)
        self._events = worker.events_blocking(job)

    def __iter__(self) -> Iterator[Step]:
        try:
            while self._running():
                step = self._take(next(self._events))
                if step is not None:
                    yield step
        finally:
            self._stop_unless_done()

    def result(self) -> Result:
        """Wait for the end of the call (reading the steps not read yet) and return its Result."""
        for _ in self:
            pass
        assert self._result is not None
        return self._result


class AsyncStream(_Reader):
    """The steps of one call, for asyncio: ``async for step in stream: ...``."""

    def __init__(self, worker: Worker, job: LoopJob, owner: object = None):
        super().__init__(job, owner)
        self._events = worker.events(job)

    async def __aiter__(self) -> AsyncIterator[Step]:
        try:
            while self._running():
                step = self._take(await self._events.__anext__())
                if step is not None:
                    yield step
        finally:
            self._stop_unless_done()

    async def result(self) -> Result:
        """Wait for the end of the call (reading the steps not read yet) and return its Result."""
        async for _ in self:
            pass
        assert self._result is not None
        return self._result
