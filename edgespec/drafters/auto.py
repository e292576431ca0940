"""``auto``: a bandit over drafters (and plain decoding), steered by measured tokens per second.

Each step one arm proposes: a drafter, or ``None`` (plain decoding: an empty tree). The reward of
a step is the tokens it committed divided by the wall time from the proposal to the update
(drafting + the target forward + verification), so an arm wins only by being faster on this
machine, not by accepting more. Arm values are exponentially decayed averages, so the choice
follows the text (lookup pays while the answer copies from the prompt and not elsewhere); each
arm is tried first, then the best is taken, with a small exploration rate. When no drafter beats
plain decoding, the plain arm is chosen and speculation is effectively off.

Every arm sees every committed token (arms not chosen get an empty tree in ``update``), so each
stays in step with the history. Which arm proposes never changes the output: the verifier is
lossless for any proposal, and the bandit's own randomness is separate from sampling's.
"""

from __future__ import annotations

import time

import numpy as np

from ..config import SamplingConfig
from ..models.target import TargetOutput
from ..tree import DraftTree
from ..verify import Accepted
from .base import Drafter

PLAIN = "none"


class AutoDrafter:
    name = "auto"

    def __init__(self, arms: dict[str, Drafter | None], explore: float = 0.05,
                 decay: float = 0.9, clock=time.perf_counter, seed: int = 0):
        assert PLAIN in arms, "auto needs the plain arm to fall back to"
        self.arms = arms
        self.explore, self.decay, self.clock = explore, decay, clock
        self.rng = np.random.default_rng(seed)
        self.value = {name: None for name in arms}  # decayed tokens/s per arm; None = untried
        self.pulls = {name: 0 for name in arms}
        self.reset()

    def reset(self) -> None:
        self.history: list[int] = []
        self.current, self.started = PLAIN, 0.0
        for arm in self.arms.values():
            if arm is not None:
                arm.reset()

    def prefill(self, tokens: list[int], target_out: TargetOutput | None,
                sampling: SamplingConfig | None = None) -> None:
        self.history = list(tokens)
        for arm in self.arms.values():
            if arm is not None:
                arm.prefill(tokens, target_out, sampling)

    def choose(self) -> str:
        untried = [n for n, v in self.value.items() if v is None]
        if untried:
            return untried[0]
        if self.rng.random() < self.explore:
            return str(self.rng.choice(list(self.arms)))
        return max(self.value, key=self.value.get)

    def propose(self, budget: int) -> DraftTree:
        self.current = self.choose()
        self.started = self.clock()
        arm = self.arms[self.current]
        if arm is None or budget <= 0:
            return DraftTree.chain(self.history[-1], [])
        return arm.propose(budget)

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput) -> None:
        elapsed = max(self.clock() - self.started, 1e-9)
        reward = len(accepted.tokens) / elapsed
        old = self.value[self.current]
        self.value[self.current] = reward if old is None else self.decay * old + (1 - self.decay) * reward
        self.pulls[self.current] += 1
        empty = DraftTree.chain(tree.tokens[0], [])
        for name, arm in self.arms.items():
            if arm is not None:
                arm.update(accepted, tree if name == self.current else empty, target_out)
        self.history.extend(accepted.tokens)

    def report(self) -> dict:
        """Per arm: steps taken and decayed tokens/s (for stats and the bench)."""
        return {n: {"steps": self.pulls[n], "tok_s": None if v is None else round(v, 2)}
                for n, v in self.value.items()}
