"""auto: the bandit keeps output exact and follows measured tokens per second."""

from __future__ import annotations


from edgespec import Engine, SamplingConfig, SpecConfig, make_drafter
from edgespec.drafters.auto import AutoDrafter
from edgespec.drafters.base import Drafter
from edgespec.drafters.draft_model import DraftModelDrafter
from edgespec.drafters.lookup import PromptLookupDrafter
from edgespec.tree import DraftTree

PROMPT = "the cat sat on the mat and the cat sat on the"


class FakeClock:
    """Every reading advances time by one unit; drafters can add their own cost."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1.0
        return self.t


class Costly:
    """Wraps a drafter and charges ``cost`` time units per proposal."""

    def __init__(self, inner, clock, cost):
        self.inner, self.clock, self.cost, self.name = inner, clock, cost, inner.name

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def propose(self, budget):
        self.clock.t += self.cost
        return self.inner.propose(budget)


class Garbage(Drafter):
    name = "garbage"

    def reset(self):
        self.history = []

    def prefill(self, tokens, target_out, sampling=None):
        self.history = list(tokens)

    def propose(self, budget):
        return DraftTree.chain(self.history[-1], [7] * min(3, budget))

    def update(self, accepted, tree, target_out):
        self.history.extend(accepted.tokens)


def test_auto_falls_back_to_plain_when_drafts_do_not_pay(target):
    clock = FakeClock()
    auto = AutoDrafter({"none": None, "garbage": Costly(Garbage(), clock, 5)}, clock=clock)
    res = Engine(target, auto).generate(PROMPT, max_tokens=60)
    assert res.token_ids == Engine(target).generate(PROMPT, max_tokens=60).token_ids
    assert auto.pulls["none"] > 4 * auto.pulls["garbage"]


def test_auto_prefers_a_drafter_that_pays(target):
    clock = FakeClock()
    oracle = DraftModelDrafter(target, SamplingConfig(), num_draft=3, adaptive=False)
    auto = AutoDrafter({"none": None, "oracle": Costly(oracle, clock, 1)}, clock=clock)
    res = Engine(target, auto).generate(PROMPT, max_tokens=60)
    assert res.token_ids == Engine(target).generate(PROMPT, max_tokens=60).token_ids
    assert auto.pulls["oracle"] > 3 * auto.pulls["none"]


def test_auto_from_the_factory_is_exact_with_real_clock(target):
    drafter = make_drafter(SpecConfig(method="auto"), target)
    assert set(drafter.arms) == {"none", "lookup"}
    res = Engine(target, drafter).generate(PROMPT, max_tokens=40)
    assert res.token_ids == Engine(target).generate(PROMPT, max_tokens=40).token_ids


class Unlucky(Costly):
    """Charges ``cost`` for its first ``bad`` proposals, then 1."""

    def __init__(self, inner, clock, cost, bad):
        super().__init__(inner, clock, cost)
        self.bad = bad

    def propose(self, budget):
        self.clock.t += self.cost if self.bad > 0 else 1
        self.bad -= 1
        return self.inner.propose(budget)


def test_auto_retries_a_drafter_after_an_unlucky_start(target):
    """A drafter that pays but whose first steps were slow is retried and then preferred."""
    clock = FakeClock()
    oracle = DraftModelDrafter(target, SamplingConfig(), num_draft=3, adaptive=False)
    auto = AutoDrafter({"none": None, "oracle": Unlucky(oracle, clock, 20, bad=2)}, clock=clock)
    res = Engine(target, auto).generate(PROMPT, max_tokens=120)
    assert res.token_ids == Engine(target).generate(PROMPT, max_tokens=120).token_ids
    assert auto.value["oracle"] > auto.value["none"]
    assert sum(s.proposed > 0 for s in res.steps[-12:]) >= 9  # it ends on the oracle
    assert auto.wait["none"] > auto.retry  # and plain decoding is now the arm far behind


def test_auto_backs_off_from_a_drafter_far_behind(target):
    clock = FakeClock()
    auto = AutoDrafter({"none": None, "garbage": Costly(Garbage(), clock, 20)}, clock=clock,
                       retry=2, max_wait=16)
    Engine(target, auto).generate(PROMPT, max_tokens=120)
    # retried after 2, 4, 8, 16, 16, ... plain steps: about one step in 16 once backed off
    assert auto.pulls["garbage"] <= 2 + 120 // 16
    assert auto.wait["garbage"] == 16


class Sure(Costly):
    """A slow drafter sure of its next proposal for two tokens in every ``every`` (a pure query
    of the history, as ``confident`` must be: auto also asks it in ``plain_next``; a match that
    lasts a token only is missed when the step after it was already launched plain)."""

    def __init__(self, inner, clock, cost, every):
        super().__init__(inner, clock, cost)
        self.every = every

    def confident(self):
        return len(self.inner.history) % self.every < 2


def test_auto_takes_a_confident_arm_outside_the_bandit(target):
    """A step an arm is sure of goes to it even while the bandit backs off from it, and such
    steps leave the bandit's values and pulls alone; the output stays exact."""
    clock = FakeClock()
    garbage = Sure(Garbage(), clock, 20, every=5)
    auto = AutoDrafter({"none": None, "garbage": garbage}, clock=clock, retry=2, max_wait=16)
    res = Engine(target, auto).generate(PROMPT, max_tokens=80)
    assert res.token_ids == Engine(target).generate(PROMPT, max_tokens=80).token_ids
    steps = len(res.steps)
    assert auto.sure_steps["garbage"] >= steps // 10 > 0
    assert auto.pulls["none"] + auto.pulls["garbage"] + auto.sure_steps["garbage"] == steps
    assert auto.pulls["garbage"] <= 2 + steps // 16  # the bandit still backs off from it
    assert auto.report()["garbage"]["sure_steps"] == auto.sure_steps["garbage"]


def test_lookup_is_confident_only_on_a_long_match():
    lookup = PromptLookupDrafter()
    lookup.prefill([1, 2, 3, 4, 9, 1, 2, 3], None)
    assert lookup.confident()  # "1 2 3" occurred before
    lookup.prefill([1, 2, 3, 4, 9, 2, 3], None)
    assert not lookup.confident()  # only "2 3"
    lookup.prefill([5, 6, 7], None)
    assert not lookup.confident()  # nothing at all


class Counting(Costly):
    """Costly, counting the updates and prefills it gets."""

    def __init__(self, inner, clock, cost):
        super().__init__(inner, clock, cost)
        self.updates = self.prefills = 0

    def update(self, accepted, tree, target_out):
        self.updates += 1
        return self.inner.update(accepted, tree, target_out)

    def prefill(self, tokens, target_out, sampling=None):
        self.prefills += 1
        return self.inner.prefill(tokens, target_out, sampling)


def test_auto_retires_an_arm_far_behind_on_every_pull(target):
    """An arm far behind on ``retire`` pulls in a row is neither taken nor kept in step any
    more, and the next request does not prefill it; the output stays exact."""
    clock = FakeClock()
    garbage = Counting(Garbage(), clock, 20)
    auto = AutoDrafter({"none": None, "garbage": garbage}, clock=clock, retry=2, max_wait=8,
                       retire=3, evidence=3)
    eng = Engine(target, auto)
    first = eng.generate(PROMPT, max_tokens=80)
    assert first.token_ids == Engine(target).generate(PROMPT, max_tokens=80).token_ids
    assert auto.retired == {"garbage"} and auto.pulls["garbage"] == 3
    assert auto.report()["garbage"]["retired"]
    updates, prefills = garbage.updates, garbage.prefills
    assert updates < 40  # retired early in the first request
    again = eng.generate(PROMPT + " mat", max_tokens=40)
    assert again.token_ids == Engine(target).generate(PROMPT + " mat", max_tokens=40).token_ids
    assert (garbage.updates, garbage.prefills) == (updates, prefills)
    assert all(s.proposed == 0 for s in again.steps)


class Slump(Costly):
    """Charges 1 per proposal, but ``slow`` for proposals ``start`` .. ``start + n - 1``."""

    def __init__(self, inner, clock, slow, start, n):
        super().__init__(inner, clock, 1)
        self.slow, self.start, self.n, self.asked = slow, start, n, 0

    def propose(self, budget):
        self.clock.t += self.slow if self.start <= self.asked < self.start + self.n else 1
        self.asked += 1
        return self.inner.propose(budget)


def test_auto_keeps_the_best_arm_through_a_run_of_slower_steps(target):
    """An oracle committing 4 tokens in 2 units (plain decoding: 1 in 1) has three steps in a
    row at 4 tokens in 4.5 units: far under its own rate, within the margin of plain decoding's,
    so it is not retired (it was, when a step was compared with the best value, its own)."""
    clock = FakeClock()
    oracle = DraftModelDrafter(target, SamplingConfig(), num_draft=3, adaptive=False)
    auto = AutoDrafter({"none": None, "oracle": Slump(oracle, clock, 3.5, start=6, n=3)},
                       clock=clock, retire=3)
    res = Engine(target, auto).generate(PROMPT, max_tokens=120)
    assert res.token_ids == Engine(target).generate(PROMPT, max_tokens=120).token_ids
    assert not auto.retired and auto.value["oracle"] > auto.value["none"]


def test_auto_keeps_an_arm_that_is_only_sometimes_behind(target):
    clock = FakeClock()
    oracle = DraftModelDrafter(target, SamplingConfig(), num_draft=3, adaptive=False)
    auto = AutoDrafter({"none": None, "oracle": Unlucky(oracle, clock, 20, bad=2)}, clock=clock,
                       retire=3)
    Engine(target, auto).generate(PROMPT, max_tokens=120)
    assert not auto.retired


class Seer(Drafter):
    """Proposes the next 3 tokens of a known continuation (all accepted), at ``cost`` time
    units, except its proposals ``start`` .. ``start + n - 1``: wrong tokens (none accepted),
    at ``slow`` units."""

    name = "seer"

    def __init__(self, continuation, clock, cost=1.0, slow=0.5, start=-1, n=0):
        self.continuation, self.clock, self.cost, self.slow = continuation, clock, cost, slow
        self.start, self.n, self.asked = start, n, 0

    def reset(self):
        self.history, self.prompt_len = [], 0

    def prefill(self, tokens, target_out, sampling=None):
        self.history, self.prompt_len = list(tokens), len(tokens)

    def propose(self, budget):
        wrong = self.start <= self.asked < self.start + self.n
        self.asked += 1
        self.clock.t += self.slow if wrong else self.cost
        done = len(self.history) - self.prompt_len
        guess = [t + 1 for t in self.continuation[done:]] if wrong else self.continuation[done:]
        return DraftTree.chain(self.history[-1], guess[: min(3, budget)])

    def update(self, accepted, tree, target_out):
        self.history.extend(accepted.tokens)


def test_auto_keeps_the_best_arm_through_a_run_of_rejected_steps(target):
    """A drafter committing 4 tokens in 2 units (plain decoding: 1 in 1) proposes wrong tokens
    ``retire`` times in a row, each step 1 token in 1.5 units: under the margin of plain
    decoding's rate, step by step, but its value (decayed over its steps) stays far ahead, so
    it is not retired (it was, when each step's own rate was compared)."""
    plain = Engine(target).generate(PROMPT, max_tokens=120).token_ids
    clock = FakeClock()
    seer = Seer(plain, clock, cost=1.0, slow=0.5, start=8, n=3)
    auto = AutoDrafter({"none": None, "seer": seer}, clock=clock, retire=3)
    res = Engine(target, auto).generate(PROMPT, max_tokens=120)
    assert res.token_ids == plain
    assert seer.asked > 11  # the wrong run happened, and the seer was taken after it
    assert not auto.retired and auto.value["seer"] > auto.value["none"]


def test_auto_does_not_retire_a_drafter_on_its_first_pulls(target):
    """A drafter that pays, whose first ``retire`` + 1 steps were each far behind (step and
    value alike), is not retired before ``evidence`` pulls: it is retried and ends preferred.
    With the evidence of its first pulls alone it would be retired."""
    plain = Engine(target).generate(PROMPT, max_tokens=160).token_ids
    for evidence, retired in ((12, False), (1, True)):
        clock = FakeClock()
        oracle = DraftModelDrafter(target, SamplingConfig(), num_draft=3, adaptive=False)
        auto = AutoDrafter({"none": None, "oracle": Unlucky(oracle, clock, 20, bad=5)},
                           clock=clock, retry=2, max_wait=4, evidence=evidence)
        res = Engine(target, auto).generate(PROMPT, max_tokens=160)
        assert res.token_ids == plain
        assert ("oracle" in auto.retired) == retired
        if not retired:
            assert auto.value["oracle"] > auto.value["none"]
