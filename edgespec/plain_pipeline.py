"""Plain greedy decoding pipelined: step t+1's one-token forward in flight while t's token is read.

As mlx-lm does, step t+1's graph is built from step t's lazy argmax and started
(``mx.async_eval``) before step t's token is read back, so building the graph, masks and the
engine's bookkeeping (a measurable share of a small model's step on a CPU) overlaps the forward.
Each forward is the step loop's plain step (a one-token tree after the committed tokens), so the
tokens, the cache and what a drafter is shown are the step loop's.

The engine runs a run of such steps when it decodes without a drafter, and inside the step loop
while its drafter says the next step is plain decoding too (``Drafter.plain_next``, asked before
the current step's token is read: the next forward is launched on that answer). A run ends when
the generation ends, or after a step for which the answer was no: its token is committed with no
forward launched past it, and the step loop takes over from it. A forward launched past the end
(a stop, the token limit, a closed stream) is waited for (its time counts) and rolled back, so
the cache holds the committed tokens but the last, as after the step loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import mlx.core as mx

from .errors import CacheRollbackError
from .targets.target import Target, TargetOutput


class Forwards:
    """One-token target forwards launched ahead of reading their tokens, oldest first.

    ``capture``: the target layers whose input states each forward keeps (a drafter's
    ``target_features``); ``keep``: also start evaluating the rows a drafter or the logprobs
    read (the logits, hidden state and captured states), beside the next token. ``lost`` is
    called when a rolled-back forward cannot be undone (a sliding window dropped what it needs):
    the cache must not be reused.
    """

    def __init__(self, target: Target, cache, capture: tuple[int, ...], keep: bool,
                 lost: Callable[[], None]):
        self.target, self.cache, self.capture, self.keep, self.lost = target, cache, capture, keep, lost
        self.outs: list[TargetOutput] = []

    def launch(self, token: mx.array) -> mx.array:
        """Start the forward of ``token`` (shape (1,), maybe lazy); its greedy next token, lazy."""
        out = self.target.score(token, self.cache, capture=self.capture)
        nxt = mx.argmax(out.logits, axis=-1)  # (1,): lazy
        self.cache.commit()  # every plain token is kept
        self.outs.append(out)
        rows = (out.logits, out.hidden, *out.captured.values()) if self.keep else ()
        mx.async_eval(nxt, *rows)
        return nxt

    def take(self) -> TargetOutput:
        """The oldest launched forward's output (the one whose token was just read)."""
        return self.outs.pop(0)

    def forget(self, ahead: mx.array) -> None:
        """Roll back the forward launched past the end, once it has finished."""
        mx.eval(ahead)
        self.outs.clear()
        try:
            self.cache.trim(1)
        except CacheRollbackError:
            self.lost()


def plain_run(forwards: Forwards, root: int, room: int, plain_next: Callable[[], bool],
              begin: Callable[[], None], finish: Callable[[int, TargetOutput, float], object],
              clock: Callable[[], float]) -> Iterator:
    """Pipelined plain steps from ``root`` (the last committed token, not in the cache), at most
    ``room`` of them; yields what ``finish(token, target_out, waited_s)`` returns for each step
    (the engine's Step: it commits the token, shows it to the drafter and emits it; a Step with a
    ``finish_reason`` ends the run). ``plain_next()`` is asked once a step, before its token is
    read: True launches the next step's forward; False makes this step the run's last.
    ``begin()`` starts each step after the first, once the step before it is finished (the
    drafter's ``propose(0)``: the step was launched as plain decoding; the first step was
    proposed by the step loop).
    """
    done, ahead = 0, None
    pending = forwards.launch(mx.array([root], dtype=mx.int32))
    try:
        while True:
            t1 = clock()
            if done + 1 < room and plain_next():
                ahead = forwards.launch(pending)
            token = int(pending.item())
            step = finish(token, forwards.take(), clock() - t1)
            done += 1
            if step.finish_reason is not None and ahead is not None:
                forwards.forget(ahead)
                ahead = None
            yield step
            if step.finish_reason is not None or ahead is None:
                return
            begin()
            pending, ahead = ahead, None
    finally:  # the consumer closed the stream with a step in flight
        if ahead is not None:
            forwards.forget(ahead)
