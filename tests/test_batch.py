"""Continuous batching (batch.py): decodings stepped together give each request exactly what it
gives alone: greedy tokens for every drafter, mixed in one batch with requests joining at
different steps and others cancelled mid-way; seeded sampled tokens whatever runs beside them;
grammar-constrained output. The forwards are really shared (rows counted), and the row budget
gives rows where they are worth most."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec import Engine, SamplingConfig
from edgespec.batch import Batch, Crashed, Ended, share
from edgespec.grammar import Grammar, GrammarRule
from edgespec.targets.cost import CostCurve

from .test_lossless import DRAFTERS, MODEL, prompt_ids

GREEDY_METHODS = ["none", "lookup", "draft", "early-exit", "eagle3", "medusa", "corpus", "auto",
                  "lookahead"]
N = 12


@pytest.fixture(scope="module")
def setup(tiny_models):
    target = tiny_models.load(**MODEL)
    draft = tiny_models.load(**{**MODEL, "scale": 1.3})
    return target, draft, prompt_ids(target)


def _prompts(target, base: list[int], k: int) -> list[list[int]]:
    """``k`` different prompts: the lossless tests' prompt with different tails."""
    rng = np.random.default_rng(7)
    return [base[: len(base) - 2 * i] + [int(t) for t in rng.integers(4, 200, size=i)]
            for i in range(k)]


def _alone(target, draft, method, ids, sampling=None, rules=None, max_tokens=N):
    s = sampling or SamplingConfig()
    engine = Engine(target, DRAFTERS[method](target, draft, s), s)
    return engine.generate(ids, max_tokens=max_tokens, rules=rules).token_ids


def _together(target, draft, jobs, joins=None, cancel=None, policy="shared"):
    """Run ``jobs`` ((method, ids, sampling, rules) each) in one Batch; job i joins at round
    ``joins[i]``; job ``cancel`` is dropped after its first step. Returns each job's tokens."""
    engine = Engine(target)
    batch = Batch(target, lambda: CostCurve((1, 8, 32), (10.0, 11.0, 16.0)), policy)
    joins = joins or [0] * len(jobs)
    decodings, tokens, ended = [], [[] for _ in jobs], set()
    for method, ids, s, rules in jobs:
        s = s or SamplingConfig()
        decodings.append(engine.start(ids, max_tokens=N, sampling=s, rules=rules,
                                      drafter=DRAFTERS[method](target, draft, s)))
    index = {id(d): i for i, d in enumerate(decodings)}
    r = 0
    while len(ended) < len(jobs):
        for i, d in enumerate(decodings):
            if joins[i] == r:
                batch.add(d)
        for d, event in batch.round():
            i = index[id(d)]
            assert not isinstance(event, Crashed), event.error
            if isinstance(event, Ended):
                ended.add(i)
                continue
            tokens[i] += event.token_ids
            if event.finish_reason is not None:
                ended.add(i)
            elif i == cancel:
                batch.drop(d)
                ended.add(i)
        r += 1
        assert r < 10 * N * len(jobs), "the batch stopped making progress"
    return tokens, batch


def test_every_drafter_in_one_batch_gives_its_alone_tokens(setup):
    target, draft, base = setup
    prompts = _prompts(target, base, len(GREEDY_METHODS))
    jobs = [(m, p, None, None) for m, p in zip(GREEDY_METHODS, prompts)]
    joins = [0, 0, 1, 3, 0, 5, 2, 0, 4]
    got, batch = _together(target, draft, jobs, joins, cancel=6)
    assert batch.shared_rows > 0  # forwards were shared
    for i, (m, p, _, _) in enumerate(jobs):
        want = _alone(target, draft, m, p)
        if i == 6:  # cancelled after its first step: a prefix of its alone tokens
            assert got[i] and want[: len(got[i])] == got[i]
        else:
            assert got[i] == want, m


@pytest.mark.parametrize("bits", [None, 8])
def test_eagle3_heads_fed_together_draft_what_they_draft_alone(setup, bits):
    """Beside others, EAGLE-3 drafters leave their head's feed to the batch, which runs them all
    as one forward (eagle3.feed_many): every tree each one proposes, with its nodes' draft
    probabilities to the bit, and its tokens, are the ones it proposes alone."""
    import edgespec.heads.eagle3 as heads
    from edgespec.drafters.eagle3 import Eagle3Drafter
    from edgespec.heads.eagle3 import quantized_head

    from .test_eagle3 import random_head

    target, _, base = setup
    head = random_head(target, seed=5)
    head = head if bits is None else quantized_head(head, bits)
    prompts = _prompts(target, base, 3)

    def drafter(trees):
        d = Eagle3Drafter(target, head, None, nodes=4)
        real = d.propose

        def propose(budget):
            tree = real(budget)  # the tree and its nodes' draft probabilities, bit for bit
            conf = None if d._confidence is None else d._confidence.tolist()
            trees.append((list(tree.tokens), list(tree.parents), conf))
            return tree

        d.propose = propose
        return d

    alone = []
    for p in prompts:
        trees: list = []
        tokens = Engine(target, drafter(trees)).generate(p, max_tokens=N).token_ids
        alone.append((tokens, trees))
    shared, real_many = [], heads.run_native_block_many

    def counting(*args, **kwargs):
        shared.append(len(args[4]))
        return real_many(*args, **kwargs)

    engine, batch = Engine(target), Batch(target, policy="full")
    together = [[] for _ in prompts]
    decodings = [engine.start(p, max_tokens=N, drafter=drafter(together[i]))
                 for i, p in enumerate(prompts)]
    for d in decodings:
        batch.add(d)
    tokens = {id(d): [] for d in decodings}
    heads.run_native_block_many = counting
    try:
        while len(batch):
            for d, event in batch.round():
                assert not isinstance(event, Crashed), event.error
                if not isinstance(event, Ended):
                    tokens[id(d)] += event.token_ids
    finally:
        heads.run_native_block_many = real_many
    assert shared and max(shared) == 3  # the three heads' feeds went as one forward
    for d, (want_tokens, want_trees), trees in zip(decodings, alone, together):
        assert tokens[id(d)] == want_tokens
        assert trees == want_trees


@pytest.mark.parametrize("policy", ["plain", "full"])
def test_the_fixed_policies_are_lossless_too(setup, policy):
    target, draft, base = setup
    prompts = _prompts(target, base, 4)
    jobs = [(m, p, None, None) for m, p in zip(["lookup", "eagle3", "none", "medusa"], prompts)]
    got, _ = _together(target, draft, jobs, policy=policy)
    for (m, p, _, _), g in zip(jobs, got):
        assert g == _alone(target, draft, m, p), m


def test_a_seeded_sampled_request_draws_the_same_tokens_beside_others(setup):
    target, draft, base = setup
    prompts = _prompts(target, base, 4)
    hot = SamplingConfig(temperature=1.0, top_k=8, seed=11)
    other = SamplingConfig(temperature=0.8, seed=5)
    jobs = [("eagle3", prompts[0], hot, None), ("lookup", prompts[1], other, None),
            ("none", prompts[2], None, None), ("draft", prompts[3], hot, None)]
    got, _ = _together(target, draft, jobs, joins=[0, 1, 0, 2])
    assert got[0] == _alone(target, draft, "eagle3", prompts[0], hot)
    assert got[1] == _alone(target, draft, "lookup", prompts[1], other)
    assert got[3] == _alone(target, draft, "draft", prompts[3], hot)
    # and beside different neighbours
    again, _ = _together(target, draft, [jobs[0], ("medusa", prompts[2], None, None)])
    assert again[0] == got[0]


def test_grammar_constrained_requests_in_a_batch(setup):
    target, draft, base = setup
    prompts = _prompts(target, base, 3)
    grammar = Grammar("regex", "(the|a) (cat|mat)")

    def rule():
        return GrammarRule(grammar, target.tokenizer)

    jobs = [("lookup", prompts[0], None, rule()), ("none", prompts[1], None, None),
            ("eagle3", prompts[2], None, rule())]
    got, _ = _together(target, draft, jobs)
    assert got[0] == _alone(target, draft, "lookup", prompts[0], rules=rule())
    assert got[2] == _alone(target, draft, "eagle3", prompts[2], rules=rule())
    assert target.tokenizer.decode(got[0]) in {"the cat", "the mat", "a cat", "a mat"}


def test_rows_go_where_they_are_worth_most():
    curve = CostCurve((1, 8, 32), (10.0, 11.0, 16.0))
    counts = share(np.array([0.9, 0.5, 0.0]), curve, 32)
    assert counts[2] == 1  # plain decoding drafts nothing
    assert counts[0] > counts[1] > 1
    assert counts.sum() <= 32
    # a steep curve: fewer rows in all
    steep = CostCurve((1, 8, 32), (10.0, 20.0, 80.0))
    assert share(np.array([0.9, 0.5, 0.0]), steep, 32).sum() < counts.sum()
    # no room beyond one row each
    assert list(share(np.array([0.9, 0.9]), curve, 2)) == [1, 1]


def test_the_measured_arm_wins_and_the_other_is_still_tried():
    from edgespec.batch import _Measured

    m = _Measured()
    speed = {"model": 100.0, "plain": 150.0}  # tokens per second each arm's rounds give
    chosen = []
    for _ in range(100):
        arm = m.choose()
        chosen.append(arm)
        m.ran(arm, 0.02)
        m.credit(int(speed[arm] * 0.02))
    assert chosen[:2] == ["model", "plain"]  # each measured once first
    assert chosen[10:].count("plain") > 80 and "model" in chosen[10:]  # explored
    m.ran(None, 0.02)  # a round with a join or a prefill is not counted
    m.credit(1000)
    assert m.rate["plain"] < 200
