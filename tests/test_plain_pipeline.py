"""Pipelined plain steps inside the step loop (``plain_pipeline.py``, ``Drafter.plain_next``):
greedy output stays plain decoding's, in and out of the pipelined runs, and the drafter is
shown every committed token with its step's target output."""

from __future__ import annotations

import mlx.core as mx
import pytest

from edgespec import Engine
from edgespec.drafters.auto import AutoDrafter
from edgespec.drafters.base import Drafter
from edgespec.drafters.eagle3 import Eagle3Drafter
from edgespec.tree import DraftTree

from .test_auto import PROMPT, Costly, FakeClock, Garbage
from .test_eagle3 import OracleHead


class Phased(Drafter):
    """Drafts through ``inner`` on the steps numbered in ``drafting`` (from 0), proposes nothing
    on the others and says so ahead (``plain_next``); checks what a plain step shows it."""

    name = "phased"

    def __init__(self, inner: Drafter, drafting: set[int]):
        self.inner, self.drafting = inner, drafting
        self.target_features, self.wants_hidden = inner.target_features, inner.wants_hidden
        self.reset()

    def reset(self):
        self.inner.reset()
        self.step, self.started_plain, self.history = 0, 0, []

    def prefill(self, tokens, target_out, sampling=None):
        self.history = list(tokens)
        self.inner.prefill(tokens, target_out, sampling)

    def propose(self, budget):
        self.started_plain += budget == 0  # only a pipelined step is started with propose(0)
        if self.step in self.drafting and budget > 0:
            return self.inner.propose(budget)
        return DraftTree.chain(self.history[-1], [])

    def plain_next(self):
        return self.step + 1 not in self.drafting

    def update(self, accepted, tree, target_out):
        if tree.num_drafted == 0:  # the target's output is the forward of this step's root
            assert target_out.logits.shape[0] == 1
            assert int(mx.argmax(target_out.logits[0])) == accepted.tokens[0]
            assert all(rows.shape[0] == 1 for rows in target_out.captured.values())
        self.inner.update(accepted, tree, target_out)
        self.history.extend(accepted.tokens)
        self.step += 1


def test_switching_in_and_out_of_pipelined_plain_steps_keeps_greedy_output(target):
    drafting = {0, 5, 6, 12, 20}
    phased = Phased(Garbage(), drafting)
    eng = Engine(target, phased)
    res = eng.generate(PROMPT, max_tokens=30)
    assert res.token_ids == Engine(target).generate(PROMPT, max_tokens=30).token_ids
    assert phased.history == eng.encode(PROMPT) + res.token_ids  # every token shown
    # four pipelined runs (after steps 0, 6, 12 and 20), each started by the step loop; the
    # steps after a run's first are started with propose(0)
    assert phased.started_plain == 30 - len(drafting) - 4
    assert res.stats.proposed == 3 * len(drafting)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 9])
def test_a_stop_or_the_token_limit_inside_a_pipelined_run(target, max_tokens):
    """The run ends on the limit or a stop string, the forward past it is rolled back (the
    cache holds every token but the last) and the next request reuses the shared prefix."""
    loop = Engine(target, pipeline=False)
    plain = loop.generate(PROMPT, max_tokens=12)
    stop = target.tokenizer.decode(plain.token_ids[4:6])
    eng = Engine(target, Phased(Garbage(), {0}))
    for kw in ({"max_tokens": max_tokens}, {"max_tokens": 12, "stop": [stop]}):
        res = eng.generate(PROMPT, **kw)
        want = loop.generate(PROMPT, **kw)
        assert (res.token_ids, res.text, res.finish_reason) == (
            want.token_ids, want.text, want.finish_reason)
        assert eng.prefixes.entries >= 1  # the cache was consistent: the store kept it
    again = eng.generate(PROMPT + " the", max_tokens=8)
    assert again.stats.cached_tokens > 0
    assert again.token_ids == loop.generate(PROMPT + " the", max_tokens=8).token_ids


def test_an_eagle3_arm_stays_in_step_through_pipelined_plain_steps(target):
    """The head is fed every committed token's target features during the pipelined runs: an
    oracle head's drafts after them are accepted (each drafting step commits 5 tokens)."""
    plain = Engine(target).generate(PROMPT, max_tokens=40)
    ids = Engine(target).encode(PROMPT)
    drafting = {6, 13, 21}
    eagle = Eagle3Drafter(target, OracleHead(target, ids + plain.token_ids), None, nodes=4)
    phased = Phased(eagle, drafting)
    res = Engine(target, phased).generate(PROMPT, max_tokens=40)
    assert res.token_ids == plain.token_ids
    assert phased.started_plain > 0 and eagle.target_features
    assert res.stats.accepted == 4 * len(drafting)


class CountingAuto(AutoDrafter):
    def propose(self, budget):
        self.started_plain = getattr(self, "started_plain", 0) + (budget == 0)
        return super().propose(budget)


def test_auto_runs_its_plain_arm_pipelined_when_plain_decoding_leads(target):
    """A drafter that never pays: auto's plain steps run pipelined between its retries, with
    the step loop's tokens and logprobs."""
    want = Engine(target, pipeline=False).generate(PROMPT, max_tokens=60, logprobs=2)
    clock = FakeClock()
    auto = CountingAuto({"none": None, "garbage": Costly(Garbage(), clock, 5)}, clock=clock)
    res = Engine(target, auto).generate(PROMPT, max_tokens=60, logprobs=2)
    assert res.token_ids == want.token_ids
    assert res.logprobs == want.logprobs
    assert auto.started_plain > 30
    assert auto.pulls["none"] + auto.pulls["garbage"] == len(res.steps)
    assert auto.pulls["garbage"] >= 3  # retries still happen, from the step loop


def test_auto_says_plain_next_only_when_the_bandit_would_choose_plain(target):
    clock = FakeClock()
    garbage = Costly(Garbage(), clock, 0)
    auto = AutoDrafter({"none": None, "garbage": garbage}, clock=clock, retry=4)
    assert not auto.plain_next()  # untried arms
    auto.value = {"none": 10.0, "garbage": 5.0}
    auto.idle = {"none": 0, "garbage": 2}
    garbage.inner.history = [1, 2]
    assert auto.plain_next()
    auto.idle["garbage"] = 3  # a retry is due once this step is counted
    assert not auto.plain_next()
    auto.idle["garbage"] = 0
    auto.value["garbage"] = 11.0  # the drafter leads
    assert not auto.plain_next()
    auto.retired.add("garbage")  # a retired arm is neither chosen nor retried
    auto.idle["garbage"] = 9
    assert auto.plain_next()


def test_auto_keeps_its_eagle3_arm_in_step_through_its_pipelined_plain_steps(target):
    """An oracle EAGLE-3 arm made dear on the fake clock: plain decoding leads and runs
    pipelined, and every retry of the arm still has its drafts accepted."""
    plain = Engine(target).generate(PROMPT, max_tokens=60)
    ids = Engine(target).encode(PROMPT)
    clock = FakeClock()
    eagle = Eagle3Drafter(target, OracleHead(target, ids + plain.token_ids), None, nodes=4)
    auto = CountingAuto({"none": None, "eagle3": Costly(eagle, clock, 60)}, clock=clock)
    res = Engine(target, auto).generate(PROMPT, max_tokens=60)
    assert res.token_ids == plain.token_ids
    assert auto.started_plain > 10 and auto.pulls["eagle3"] >= 2
    assert res.stats.accepted >= 4 * (auto.pulls["eagle3"] - 1)
