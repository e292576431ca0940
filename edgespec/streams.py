"""One call's output as it is generated: :class:`Stream` (threads) and :class:`AsyncStream`
(asyncio), both reading a job of the generation thread (``worker.py``).

Contract: iterating yields the call's :class:`~edgespec.engine.Step` events in order, one per
target forward: ``step.text``, ``step.token_ids`` and ``step.segments`` (runs of text marked
``drafted`` when they came from drafts the target accepted). ``result()`` waits for the end and
returns the whole :class:`~edgespec.engine.Result`, built from the same steps. ``cancel()`` may be
called from any thread or task: the call ends after its current step with
``finish_reason == "cancelled"`` (text held back for a possible stop string is dropped), and the
engine's cache stays consistent for the next call. Leaving the loop early, ``close()``, Ctrl+C
while waiting, cancelling the awaiting task or dropping the stream all cancel the call too.
"""

from __future__ import annotations

import weakref

from .engine import Result, Step
from .worker import Done, Event, Failed, Job, LoopJob, ThreadJob, Worker


class _Reader:
    """What both streams share: the job, the steps so far, the result once it is done."""

    def __init__(self, job: Job):
        self._job = job
        self._steps: list[Step] = []
        self._result: Result | None = None
        weakref.finalize(self, job.cancel)  # a stream dropped unread does not keep generating

    def cancel(self) -> None:
        """End the call after its current step (safe from any thread or task)."""
        self._job.cancel()

    @property
    def done(self) -> bool:
        """Whether the call has ended and ``result()`` returns without waiting."""
        return self._result is not None

    def _take(self, event: Event) -> Step | None:
        """The step ``event`` carries; None when it ends the call (the result is then kept)."""
        if isinstance(event, Step):
            self._steps.append(event)
            return event
        if isinstance(event, Done):
            self._result = Result.from_steps(self._steps, event.stats, event.finish_reason)
            return None
        assert isinstance(event, Failed)
        raise event.error


class Stream(_Reader):
    """The steps of one call, for a thread: ``for step in stream: print(step.text, end="")``."""

    def __init__(self, worker: Worker, job: ThreadJob):
        super().__init__(job)
        self._events = worker.events_blocking(job)

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Step:
        while self._result is None:
            try:
                event = next(self._events)
            except BaseException:  # Ctrl+C while waiting, or the worker stopped: end the call
                self.cancel()
                raise
            step = self._take(event)
            if step is not None:
                return step
        raise StopIteration

    def result(self) -> Result:
        """Wait for the end of the call (reading the steps not read yet) and return its Result."""
        for _ in self:
            pass
        assert self._result is not None
        return self._result

    def close(self) -> None:
        """Cancel the call if it is still running (what leaving a ``with`` block does)."""
        self.cancel()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncStream(_Reader):
    """The steps of one call, for asyncio: ``async for step in stream: ...``."""

    def __init__(self, worker: Worker, job: LoopJob):
        super().__init__(job)
        self._events = worker.events(job)

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> Step:
        while self._result is None:
            try:
                event = await self._events.__anext__()
            except BaseException:  # the awaiting task was cancelled, or the worker stopped
                self.cancel()
                raise
            step = None if event is None else self._take(event)  # None: a tick spent waiting
            if step is not None:
                return step
        raise StopAsyncIteration

    async def result(self) -> Result:
        """Wait for the end of the call (reading the steps not read yet) and return its Result."""
        async for _ in self:
            pass
        assert self._result is not None
        return self._result

    async def aclose(self) -> None:
        """Cancel the call if it is still running (what leaving an ``async with`` block does)."""
        self.cancel()
        await self._events.aclose()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
