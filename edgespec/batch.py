"""Continuous batching: several decodings stepped together, sharing each target forward.

Contract: ``Batch.round()`` advances every decoding in it by at most one step and returns what
they produced: each decoding's :class:`~edgespec.engine.Step` (at most one a round), its end, or
its failure. The forwards the decodings ask for in a round are scored together where they can
be (``targets/batched.score_many``: each sequence's rows get the bits they get alone), in
forwards of at most ``max_rows`` rows; prefill chunks, and forwards through a drafter's lower
layers, run alone, one per decoding per round, so a long prompt joining does not stall the
others for its whole prefill. A decoding joins with ``add`` before any round and leaves when it
ends, fails or is dropped (``drop``: a cancelled request or a client gone; its generator is
closed at once).

Each decoding keeps its own drafter, cache, stats and random stream, and the forwards it is
sent are the ones it would compute alone, so its greedy tokens are those of the same request
decoded alone, and a seeded sampled request draws the same tokens whatever runs beside it.

**The row budget.** Alone, a decoding drafts as its drafter chooses (the whole tree). With
others, the policy sets each decoding's ``rows`` (tree nodes, root included) before it
proposes:

- ``shared`` (the default): each decoding's k-th drafted row is worth p^k expected accepted
  tokens, p its own acceptance rate so far (accepted tokens over accepted tokens plus steps
  that rejected a draft, from a prior of 2 in 3); the round takes the most valuable rows of
  all decodings for the total R that maximises expected tokens per ms on the target's
  measured verify-cost curve (``targets/cost.py``), R at most ``max_rows``. That curve prices
  the forward only, not the drafting each drafted row brings (a head's forwards, the host's
  work): so the batch also measures what rounds give, tokens per second under this sharing
  and under one row each, and takes the better of the two (``_Measured``: every tenth round
  tries the other while both are measured);
- ``plain``: one row each (no speculation while others decode);
- ``full``: every decoding drafts as if alone (forwards split at ``max_rows`` rows).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .drafters.eagle3 import feed_many
from .engine import Decoding, Need, Step
from .kernels.backend import SMALL_M_MAX
from .targets.batched import score_many
from .targets.cost import CostCurve
from .targets.target import Target

POLICIES = ("shared", "plain", "full")
_PAUSED = object()  # ``Batch._advance``: stopped after its step, to go on once the heads are fed
_PRIOR_ACCEPTED, _PRIOR_REJECTED = 2.0, 1.0


@dataclass
class Ended:
    """A decoding's generator returned (its last Step carried the finish reason)."""


@dataclass
class Crashed:
    """A decoding raised: ``error`` (the others go on)."""

    error: BaseException


class _Slot:
    """A decoding in the batch: what to send it next, a Step it produced past this round's,
    and its acceptance record."""

    def __init__(self, d: Decoding):
        self.d = d
        self.sent = None  # the output of the forward it asked for, sent on its next advance
        self.held: Step | None = None  # a second step produced in one round (pipelined)
        self.accepted, self.rejected = _PRIOR_ACCEPTED, _PRIOR_REJECTED

    @property
    def p(self) -> float:
        if self.d.drafter is None:
            return 0.0
        return self.accepted / (self.accepted + self.rejected)

    def saw(self, step: Step) -> None:
        self.accepted += step.accepted
        self.rejected += step.accepted < step.proposed


class Batch:
    """The decodings of one target being stepped together (one thread: the worker's)."""

    def __init__(self, target: Target, curve: Callable[[], CostCurve | None] = lambda: None,
                 policy: str = "shared", max_rows: int = SMALL_M_MAX,
                 waiting: Callable[[], bool] = lambda: False):
        if policy not in POLICIES:
            raise ValueError(f"batch policy {policy!r}: expected one of {', '.join(POLICIES)}")
        self.target, self.policy, self.max_rows = target, policy, max_rows
        self._curve, self._curve_fn = None, curve
        self.waiting = waiting  # whether a decoding is about to join (then none is alone)
        self.slots: list[_Slot] = []
        self._measured = _Measured()
        self.forwards = 0  # target forwards run (shared ones count once)
        self.shared_rows = 0  # rows scored in forwards shared by two decodings or more

    def __len__(self) -> int:
        return len(self.slots)

    def add(self, d: Decoding) -> None:
        d.alone = lambda: len(self.slots) == 1 and not self.waiting()
        self.slots.append(_Slot(d))

    def drop(self, d: Decoding) -> None:
        """Take ``d`` out now and close its generator (its cache stays consistent: commits
        happen only after a forward's output arrives)."""
        for s in self.slots:
            if s.d is d:
                self.slots.remove(s)
                d.gen.close()
                return

    def round(self) -> list[tuple[Decoding, Step | Ended | Crashed]]:
        events: list[tuple[Decoding, Step | Ended | Crashed]] = []
        t0, n = time.perf_counter(), len(self.slots)
        arm = self._measured.choose() if self.policy == "shared" and n > 1 else None
        self._share_rows(arm)
        needs: list[tuple[_Slot, Need]] = []
        paused: list[_Slot] = []  # emitted their step; their next proposal waits for the feeds
        for s in list(self.slots):
            need = self._advance(s, events, pause=n > 1)
            if need is _PAUSED:
                paused.append(s)
            elif need is not None:
                needs.append((s, need))
        self._feed_heads(paused)
        for s in paused:
            need = self._advance(s, events, resume=True)
            if need is not None:
                needs.append((s, need))
        self._measured.credit(sum(len(e.token_ids) for _, e in events if isinstance(e, Step)))
        self._run(needs, events)
        steady = len(self.slots) == n and all(need.part is not None for _, need in needs)
        self._measured.ran(arm if steady else None, time.perf_counter() - t0)
        return events

    def _advance(self, s: _Slot, events: list, pause: bool = False,
                 resume: bool = False) -> Need | object | None:
        """Run ``s``'s decoding up to its next forward, emitting at most one step. ``pause``:
        stop right after that step (returns ``_PAUSED``; the heads' feeds run before the
        decodings propose again), to go on with ``resume``."""
        emitted = int(resume)
        try:
            if resume:
                item = s.d.gen.send(None)
            elif s.held is not None:
                item, s.held = s.held, None
            else:
                item, s.sent = s.d.gen.send(s.sent), None
            while not isinstance(item, Need):
                if emitted:
                    s.held = item  # a pipelined run's next step: next round's
                    return None
                events.append((s.d, item))
                s.saw(item)
                emitted += 1
                if item.finish_reason is not None:
                    self._end(s, events, None)
                    return None
                if pause:
                    return _PAUSED
                item = s.d.gen.send(None)
            return item
        except StopIteration:
            self._end(s, events, Ended())
        except Exception as e:  # noqa: BLE001 - one decoding's failure is its own
            self._end(s, events, Crashed(e))
        return None

    def _feed_heads(self, paused: list[_Slot]) -> None:
        """The paused decodings' due head feeds as one forward (``eagle3.feed_many``); what it
        does not feed, each drafter's next ``propose`` does (so a failure here is not one)."""
        feeds = [f for s in paused if s.d.drafter is not None for f in s.d.drafter.head_feeds()]
        if feeds:
            try:
                feed_many(feeds)
            except Exception:  # noqa: BLE001 - each proposal then feeds its own, or fails alone
                pass

    def _end(self, s: _Slot, events: list, event) -> None:
        self.slots.remove(s)
        s.d.gen.close()
        if event is not None:
            events.append((s.d, event))

    def _run(self, needs: list[tuple[_Slot, Need]], events: list) -> None:
        shareable = [(s, n) for s, n in needs if n.part is not None]
        for s, n in needs:
            if n.part is None:
                self._answer(s, n.run, events)
        group: list[tuple[_Slot, Need]] = []
        rows = 0
        for s, n in shareable:
            size = len(n.part.ids)
            if group and rows + size > self.max_rows:
                self._score(group, events)
                group, rows = [], 0
            group.append((s, n))
            rows += size
        if group:
            self._score(group, events)

    def _score(self, group: list[tuple[_Slot, Need]], events: list) -> None:
        if len(group) == 1:
            self._answer(group[0][0], group[0][1].run, events)
            return
        try:
            outs = score_many(self.target, [n.part for _, n in group])
        except Exception:  # noqa: BLE001 - score each alone: only a faulty one fails
            for s, n in group:
                self._answer(s, n.run, events)
            return
        self.forwards += 1
        self.shared_rows += sum(len(n.part.ids) for _, n in group)
        for (s, _), out in zip(group, outs):
            s.sent = out

    def _answer(self, s: _Slot, run, events: list) -> None:
        try:
            s.sent = run()
            self.forwards += 1
        except Exception as e:  # noqa: BLE001
            self._end(s, events, Crashed(e))

    def _share_rows(self, arm: str | None) -> None:
        """Set every decoding's ``rows`` for the step it proposes next (the policy above)."""
        slots = self.slots
        for s in slots:  # beside others, a trained head's feed waits for the batch's
            if s.d.drafter is not None:
                s.d.drafter.share_heads(len(slots) > 1)
        if len(slots) <= 1 or self.policy == "full":
            for s in slots:
                s.d.rows = None
            return
        if self.policy == "plain" or arm == "plain":
            for s in slots:
                s.d.rows = 1
            return
        if self._curve is None:
            self._curve = self._curve_fn()  # once it is had (measured once per machine)
        counts = share(np.array([s.p for s in slots]), self._curve, self.max_rows)
        for s, k in zip(slots, counts):
            s.d.rows = int(k)


class _Measured:
    """Tokens per second of the rounds run with the rows shared by value (``"model"``) and with
    one row each (``"plain"``): an exponential average per arm of the tokens a round's forward
    committed (they are emitted in the next round) over the round's time. Rounds where a
    decoding joined, left or ran a forward alone (a prefill) are not counted."""

    ARMS = ("model", "plain")
    DECAY = 0.9
    EXPLORE = 10  # every this many rounds, the arm not chosen

    def __init__(self):
        self.rate: dict[str, float | None] = {a: None for a in self.ARMS}
        self.rounds = 0
        self._last: tuple[str, float] | None = None  # the last counted round: (arm, seconds)

    def choose(self) -> str:
        self.rounds += 1
        unmeasured = [a for a in self.ARMS if self.rate[a] is None]
        if unmeasured:
            return unmeasured[0]
        best = max(self.ARMS, key=lambda a: self.rate[a])
        if self.rounds % self.EXPLORE == 0:
            return next(a for a in self.ARMS if a != best)
        return best

    def ran(self, arm: str | None, seconds: float) -> None:
        self._last = (arm, seconds) if arm is not None and seconds > 0 else None

    def credit(self, tokens: int) -> None:
        if self._last is None:
            return
        arm, seconds = self._last
        self._last = None
        r, old = tokens / seconds, self.rate[arm]
        self.rate[arm] = r if old is None else self.DECAY * old + (1 - self.DECAY) * r


def share(p: np.ndarray, curve: CostCurve | None, max_rows: int) -> np.ndarray:
    """Rows per decoding (each at least 1, in all at most ``max_rows``) maximising expected
    committed tokens per ms: decoding i's k-th drafted row is worth p[i]**k; the rows taken are
    the most valuable ones. Without a cost curve, every row up to ``max_rows`` is taken while
    it is worth anything."""
    n = len(p)
    extra = max_rows - n
    if extra <= 0:
        return np.ones(n, dtype=np.int64)
    k = np.arange(1, extra + 1)
    values = np.asarray(p, dtype=np.float64)[:, None] ** k[None, :]  # (n, extra)
    order = np.argsort(-values, axis=None, kind="stable")[:extra]
    flat = values.ravel()[order]
    owner = order // extra
    expected = n + np.concatenate([[0.0], np.cumsum(flat)])
    if curve is None:
        take = int(np.count_nonzero(flat > 0))
    else:
        cost = curve.ms_range(n, extra + 1)
        take = int(np.argmax(expected / cost))
    counts = np.ones(n, dtype=np.int64)
    np.add.at(counts, owner[:take], 1)
    return counts
