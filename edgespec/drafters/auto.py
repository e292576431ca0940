"""``auto``: a bandit over drafters (and plain decoding), steered by measured tokens per second.

Each step one arm proposes: a drafter, or ``None`` (plain decoding: an empty tree). An arm's
value is its throughput: committed tokens over wall time from proposal to update (drafting +
the target forward + verification), both summed with a decay per step, so an arm wins only by
being faster on this machine, not by accepting more. Decay lets the choice follow the text
(lookup pays while the answer copies from the prompt and not elsewhere).

Each arm is tried first, then the best is taken. An arm not taken for ``retry`` steps is taken
once more, since its value is stale and a few unlucky steps would otherwise shut out a drafter
that pays; an arm far behind the best (under ``margin`` of its value) waits twice as long
before each further retry, up to ``max_wait`` steps, so a drafter that does not pay costs at
most about one step in ``max_wait``. An arm whose step and value were both far behind the best
other (unretired) arm's value on ``retire`` pulls in a row, once it has had ``evidence`` pulls
(with the waits doubling, some 300 steps by default), is retired for the engine's life: it is
neither taken nor kept in step any more, and from the next request on its needs (EAGLE-3's
target features, its prefill over the prompt) cost nothing (an arm never taken still slows
auto through those needs: see docs/measurements.md, "auto's retire rule"). When no drafter beats
plain decoding, the plain arm is chosen and speculation is effectively off. The defaults came
from replaying recorded demo-model answers against the measured cost curve with timing noise.
Auto may also run without a plain arm, when all its drafting arms gate themselves
(``Drafter.gates_itself``, ``registry._auto``): the arms' own empty proposals are then its plain
steps, run by the step loop and credited to the arm that proposed them.

When plain decoding is the best value and no retry is due, auto says its next step will be
plain decoding too (``plain_next``) and the engine runs such steps pipelined, as it runs plain
decoding without a drafter (``plain_pipeline.py``); every arm is still shown each committed token
with the target's output of its step (EAGLE-3's features included). A step that was launched
plain before auto learned the token before it (a confident arm, a value overtaken) is proposed
with ``propose(0)`` and credited to plain decoding; the arm waits one step.

An arm may also say that its next proposal is sure to pay (``confident()``: prompt lookup, or
the corpus drafter, with a match of 3 or more tokens: replaying the demo model's training
answers against its cost curve estimates such steps well above plain decoding, see lookup.py).
Such a step goes to that arm outside the bandit: it neither counts as a pull nor moves any
value, so the bandit decides only the steps where the evidence is weak (a 1- or 2-token match,
estimated near plain decoding), rather than letting a plain-decoding retry throw away a long
match.

Every arm sees every committed token (arms not chosen get an empty tree in ``update``), so each
stays in step with the history; the target's output goes to every arm, and ``auto`` declares the
union of its arms' ``target_features`` / ``wants_hidden``, so an EAGLE-3 arm learns the true
features of every committed token, whichever arm proposed. Which arm proposes never changes the output: the verifier is
lossless for any proposal, and the bandit draws no random numbers of its own.
"""

from __future__ import annotations

import time

from ..config import SamplingConfig
from ..targets.target import TargetOutput
from ..tree import DraftTree
from ..verify import Accepted
from .base import Drafter

PLAIN = "none"


class AutoDrafter(Drafter):
    name = "auto"

    def __init__(self, arms: dict[str, Drafter | None], decay: float = 0.9, retry: int = 4,
                 max_wait: int = 32, margin: float = 0.75, retire: int = 4,
                 evidence: int = 12, clock=time.perf_counter):
        self.arms = arms
        self.decay, self.retry, self.max_wait, self.margin = decay, retry, max_wait, margin
        self.retire, self.evidence = retire, evidence
        self.retired: set[str] = set()
        self.behind = {name: 0 for name in arms}  # pulls in a row far behind (see _learn)
        self.clock = clock
        self.value = {name: None for name in arms}  # tokens/s; None = untried
        self.sums = {name: (0.0, 0.0) for name in arms}  # decayed (tokens, seconds)
        self.idle = {name: 0 for name in arms}  # steps since the arm last proposed
        self.wait = {name: retry for name in arms}  # steps before it is retried
        self.pulls = {name: 0 for name in arms}  # bandit steps
        self.sure_steps = {name: 0 for name in arms}  # steps taken on an arm's confidence
        self.reset()

    def _live(self) -> list[Drafter]:
        return [a for n, a in self.arms.items() if a is not None and n not in self.retired]

    # abilities the engine honours (read at the start of a request) for the live arms that
    # declare them (EAGLE-3's features)
    @property
    def target_features(self) -> tuple[int, ...]:
        return tuple(sorted({i for a in self._live() for i in a.target_features}))

    @property
    def wants_hidden(self) -> bool:
        return any(a.wants_hidden for a in self._live())

    def reset(self) -> None:
        self.history: list[int] = []
        self.current, self.started, self.sure = PLAIN, 0.0, False
        for arm in self.arms.values():
            if arm is not None:
                arm.reset()

    def prefill(self, tokens: list[int], target_out: TargetOutput | None,
                sampling: SamplingConfig | None = None) -> None:
        self.history = list(tokens)
        for arm in self._live():
            arm.prefill(tokens, target_out, sampling)

    def choose(self) -> str:
        names = [n for n in self.arms if n not in self.retired]
        untried = [n for n in names if self.value[n] is None]
        if untried:
            return untried[0]
        stale = [n for n in names if self.idle[n] >= self.wait[n]]
        if stale:
            return max(stale, key=self.idle.get)
        return max(names, key=self.value.get)

    def propose(self, budget: int) -> DraftTree:
        sure = [n for n, a in self.arms.items()
                if a is not None and n not in self.retired and a.confident()] if budget > 0 else []
        self.sure = bool(sure)
        # a step with no room to draft is plain decoding, whichever arm would have been chosen
        self.current = sure[0] if sure else self.choose() if budget > 0 else PLAIN
        if sure:
            self.sure_steps[self.current] += 1
        self.started = self.clock()
        arm = self.arms.get(self.current)
        if arm is None or budget <= 0:
            return DraftTree.chain(self.history[-1], [])
        return arm.propose(budget)

    def plain_next(self) -> bool:
        """Whether the next step will be plain decoding too, asked after proposing a plain step
        and before its update: every live arm tried, plain decoding the best value, no arm due
        for a retry once this step is counted, none confident. The step's outcome may still
        change the choice (plain decoding's value, an arm's confidence); the engine then runs
        that next step plain anyway (``propose(0)``) and asks again."""
        names = [n for n in self.arms if n not in self.retired]
        if any(self.value[n] is None for n in names):
            return False
        if any(n != PLAIN and self.idle[n] + 1 >= self.wait[n] for n in names):
            return False
        if any(a.confident() for a in self._live()):
            return False
        return max(names, key=self.value.get) == PLAIN

    def share_heads(self, on: bool) -> None:
        for arm in self._live():
            arm.share_heads(on)

    def head_feeds(self) -> list:
        return [d for arm in self._live() for d in arm.head_feeds()]

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput) -> None:
        if not self.sure and self.current in self.arms:
            self._learn(len(accepted.tokens), max(self.clock() - self.started, 1e-9))
        empty = DraftTree.chain(tree.tokens[0], [])
        for name, arm in self.arms.items():
            if arm is not None and name not in self.retired:
                arm.update(accepted, tree if name == self.current else empty, target_out)
        self.history.extend(accepted.tokens)

    def _learn(self, committed: int, elapsed: float) -> None:
        """Credit a bandit step's tokens and seconds to the arm that proposed it."""
        # evidence fades with every step, for every arm
        self.sums = {n: (self.decay * t, self.decay * s) for n, (t, s) in self.sums.items()}
        tokens, seconds = self.sums[self.current]
        tokens, seconds = tokens + committed, seconds + elapsed
        self.sums[self.current] = (tokens, seconds)
        self.value[self.current] = tokens / seconds
        self.pulls[self.current] += 1
        for name in self.idle:
            self.idle[name] = 0 if name == self.current else self.idle[name] + 1
        best = max(v for v in self.value.values() if v is not None)
        behind = self.value[self.current] < self.margin * best
        self.wait[self.current] = min(2 * self.wait[self.current], self.max_wait) if behind else self.retry
        # a pull counts towards retiring when both this step's rate and the arm's value (its
        # decayed rate) are far behind the best OTHER arm's value (what would run instead; the
        # best value, its own included, would let the best arm's ordinary 1-token steps retire
        # it). One good step clears an unlucky start. The value keeps a drafter far ahead on
        # average: judged on the step's rate alone, over hundreds of steps it meets some run of
        # `retire` rejected steps, each a token in a step dearer than plain decoding's, and is
        # retired for good by chance (see docs/measurements.md, "auto's retire rule")
        others = [v for n, v in self.value.items()
                  if v is not None and n != self.current and n not in self.retired]
        bar = self.margin * max(others) if others else 0.0
        now_behind = committed / elapsed < bar and self.value[self.current] < bar
        self.behind[self.current] = self.behind[self.current] + 1 if now_behind else 0
        if (self.current != PLAIN and self.behind[self.current] >= self.retire
                and self.pulls[self.current] >= self.evidence):
            self.retired.add(self.current)

    def report(self) -> dict:
        """Per arm: bandit steps, steps taken on its confidence, decayed tokens/s, retired."""
        return {n: {"steps": self.pulls[n], "sure_steps": self.sure_steps[n],
                    "tok_s": None if v is None else round(v, 2), "retired": n in self.retired}
                for n, v in self.value.items()}

