"""Rules under speculation: penalties and a grammar-like rule stay lossless with every drafter.

- Penalties: each tree node's row equals the row plain decoding computes once that node's path
  is committed, and the one-node row matches the definitions written out naively.
- ``rule_tree``: drafted nodes a rule forbids are cut with their subtrees, forced runs are added
  (merged with drafted nodes holding them), and each drafter is told the outcome on its own tree.
- Greedy: with every drafter of ``test_lossless.DRAFTERS``, output under the rule equals plain
  decoding under it, token for token (and the rule was exercised: tokens cut, forced, penalised).
- Sampling: the joint distribution of the first tokens follows the ruled target's
  (``test_lossless``'s G-test); a rule that ignores the tree path (penalties from the committed
  tokens only) and an engine that cuts sampled drafts without masking their ``q`` both fail it.
"""

from __future__ import annotations

from collections import Counter

import httpx
import mlx.core as mx
import numpy as np
import pytest

import edgespec.engine
from edgespec import Engine, SamplingConfig
from edgespec.drafters.base import Drafter
from edgespec.penalties import Penalties
from edgespec.rule_tree import masked_q, shape, views
from edgespec.rules import Rule, Rules
from edgespec.sampling import probs
from edgespec.targets.target import TargetOutput
from edgespec.tree import DraftTree
from edgespec.verify import Accepted

from .live_server import HI, assert_error, chat
from .live_server import client, live, model_dir  # noqa: F401  (fixtures)
from .rule_fixtures import BanAndForce
from .test_lossless import CFG, DRAFTERS, L, MODEL, RUNS, ALPHA, joint_pvalue, prompt_ids
from .tiny import logits_from_scratch

PENALTIES = {"frequency_penalty": 0.7, "presence_penalty": 0.4, "repetition_penalty": 1.6}


@pytest.fixture(scope="module")
def setup(tiny_models):
    target = tiny_models.load(**MODEL)
    draft = tiny_models.load(**{**MODEL, "scale": 1.3})
    return target, draft, prompt_ids(target)


# --- penalties ----------------------------------------------------------------------------------

def naive_penalised(row: np.ndarray, prompt: list[int], generated: list[int], f: float, a: float,
                    r: float) -> np.ndarray:
    """The definitions, token by token: repetition over prompt + generated, then OpenAI's."""
    out = row.astype(np.float64).copy()
    for t in set(prompt) | set(generated):
        out[t] = out[t] / r if out[t] > 0 else out[t] * r
    for t in set(generated):
        out[t] -= generated.count(t) * f + a
    return out


def test_penalties_match_the_definitions_at_every_tree_node():
    rng = np.random.default_rng(0)
    V, prompt, generated = 40, [1, 2, 3, 2], [5, 7, 5]
    tree = DraftTree([7, 5, 9, 5, 1], [-1, 0, 1, 0, 3])  # two branches, repeats on both
    logits = rng.normal(size=(len(tree), V)).astype(np.float32) * 3
    rule = Penalties(0.7, 0.4, 1.6)
    rule.reset(prompt)
    rule.commit(generated)
    got = np.array(rule.apply(tree, mx.array(logits)))
    for u in range(len(tree)):
        path = [tree.tokens[i] for i in tree.path_to(u)[1:]]
        want = naive_penalised(logits[u], prompt, generated + path, 0.7, 0.4, 1.6)
        np.testing.assert_allclose(got[u], want, rtol=1e-5, atol=1e-5)


# --- the tree under rules -----------------------------------------------------------------------

def test_shape_cuts_forbidden_subtrees_adds_forced_runs_and_maps_back():
    # root 1; drafted: 2 -> 3 -> 4, and 6 (banned) -> 2; the trigger 3 forces 8, 9
    drafted = DraftTree([1, 2, 3, 4, 6, 2], [-1, 0, 1, 2, 0, 4],
                        q=None, source=["root", "a", "a", "a", "b", "b"])
    rule = Rules([BanAndForce({6, 4}, trigger=3, run=[8, 9])])
    rule.reset([1])
    shaped = shape(drafted, rule, budget=8)
    t = shaped.tree
    assert t.tokens == [1, 2, 3, 8, 9] and t.parents == [-1, 0, 1, 2, 3]
    assert shaped.origin == [0, 1, 2, -1, -1]
    assert t.source == ["root", "a", "a", "forced", "forced"]
    out = TargetOutput(mx.arange(5 * 3).reshape(5, 3), mx.arange(5 * 2).reshape(5, 2))
    seen = views(shaped, Accepted([0, 1, 2, 3, 4], [2, 3, 8, 9, 11]), out)
    (own, tree0, rows0), (rest, tree1, rows1) = seen
    assert tree0 is drafted and own.path == [0, 1, 2] and own.tokens == [2, 3, 8]
    # the drafter's rows: its own nodes, a cut node gets its nearest kept ancestor's row
    assert np.array(rows0.hidden)[:, 0].tolist() == [0, 2, 4, 4, 0, 0]
    assert tree1.tokens == [8] and rest.path == [0, 1] and rest.tokens == [9, 11]
    assert np.array(rows1.hidden)[:, 0].tolist() == [6, 8]
    # a budget of 2 drafts keeps the forced run within it
    assert shape(drafted, rule, budget=2).tree.tokens == [1, 2, 3]


def test_masked_q_conditions_each_row_on_the_allowed_tokens():
    q = np.array([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.0, 0.0, 1.0]])
    tree = DraftTree([0, 1, 2], [-1, 0, 1], q=q)
    logits = mx.array([[0.0, 0.0, -np.inf], [-np.inf, -np.inf, 1.0], [0.0, 0.0, 0.0]])
    got = masked_q(tree, logits).q
    np.testing.assert_allclose(got[0], [0.625, 0.375, 0.0])
    np.testing.assert_allclose(got[1], [0.0, 0.0, 1.0])
    np.testing.assert_allclose(got[2], q[2])  # a leaf's row: no children to condition


# --- greedy: every drafter, token for token -----------------------------------------------------

def _ban_and_force(target, ids) -> BanAndForce:
    """A rule that changes the greedy output: the plain output's third token banned, its first
    token forcing the three tokens that followed it there."""
    plain = Engine(target).generate(ids, max_tokens=12).token_ids
    return BanAndForce({plain[2]}, plain[0], plain[5:8])


@pytest.mark.parametrize("method", list(DRAFTERS))
def test_greedy_output_under_rules_equals_plain_decoding(setup, method):
    target, draft, ids = setup
    greedy = SamplingConfig(**PENALTIES)
    make = DRAFTERS[method]
    for rule, sampling in ((lambda: _ban_and_force(target, ids), SamplingConfig()),
                           (lambda: None, greedy)):
        want = Engine(target, None, sampling).generate(ids, max_tokens=16, rules=rule())
        got = Engine(target, make(target, draft, sampling), sampling).generate(
            ids, max_tokens=16, rules=rule())
        assert got.token_ids == want.token_ids, (method, sampling)
    unruled = Engine(target).generate(ids, max_tokens=16).token_ids
    assert want.token_ids != unruled  # the penalties changed the output


def test_plain_greedy_under_rules_follows_the_rule(setup):
    target, _, ids = setup
    rule = _ban_and_force(target, ids)
    out = Engine(target).generate(ids, max_tokens=16, rules=rule).token_ids
    assert not set(out) & rule.banned
    at = out.index(rule.trigger)
    assert out[at + 1 : at + 1 + len(rule.run)] == rule.run


class Finishes(Rule):
    """Finished after ``n`` generated tokens."""

    def __init__(self, n: int):
        self.n, self.count = n, 0

    def reset(self, prompt):
        self.count = 0

    def commit(self, tokens):
        self.count += len(tokens)

    def finished(self):
        return self.count >= self.n


def test_a_finished_rule_ends_generation_with_stop(setup):
    target, _, ids = setup
    res = Engine(target).generate(ids, max_tokens=16, rules=Finishes(5))
    assert res.finish_reason == "stop" and len(res.token_ids) == 5


# --- sampling: the ruled distribution -----------------------------------------------------------

def exact_ruled_joint(target, ids, cfg: SamplingConfig, make_rule) -> dict:
    """P(first L tokens) under plain sampling with the rule, each prefix run from scratch and
    transformed as a one-node tree after committing the prefix."""
    joint = {(): 1.0}
    for _ in range(L):
        longer = {}
        for seq, pr in joint.items():
            rule = make_rule()
            rule.reset(ids)
            rule.commit(list(seq))
            row = logits_from_scratch(target, ids + list(seq))[-1]
            tree = DraftTree.chain((ids + list(seq))[-1], [])
            p = probs(np.array(rule.apply(tree, mx.array(row[None]))), cfg)[0]
            longer.update({seq + (int(t),): pr * p[t] for t in np.flatnonzero(p)})
        joint = longer
    return joint


def ruled_pvalue(engine: Engine, ids, cfg: SamplingConfig, make_rule, exact) -> tuple[float, int]:
    counts, accepted = Counter(), 0
    for seed in range(RUNS):
        sampling = SamplingConfig(**{**vars(cfg), "seed": seed})
        res = engine.generate(ids, max_tokens=L, sampling=sampling, rules=make_rule())
        counts[tuple(res.token_ids)] += 1
        accepted += res.stats.accepted
    return joint_pvalue(counts, exact), accepted


class CommittedOnly(Penalties):
    """Wrong: every node penalised from the committed tokens alone, its drafted path ignored."""

    def apply(self, tree, logits):
        root = DraftTree.chain(tree.tokens[0], [])
        rows = [super(CommittedOnly, self).apply(root, logits[u : u + 1]) for u in range(len(tree))]
        return mx.concatenate(rows)


STRONG = {"frequency_penalty": -2.0, "presence_penalty": -2.0}
"""Penalties that favour repeats: the target then often repeats a token drafted one step
earlier, so a rule that ignores the drafted path is visible (positive ones leave the few
sequences of this test's filtered distribution unchanged)."""


@pytest.mark.parametrize("method", ["draft", "eagle3", "none"])
def test_sampling_with_penalties_follows_the_penalised_target(setup, method):
    target, draft, ids = setup
    cfg = SamplingConfig(**CFG, **STRONG)
    exact = exact_ruled_joint(target, ids, SamplingConfig(**CFG), lambda: Penalties(-2.0, -2.0))
    engine = Engine(target, DRAFTERS[method](target, draft, cfg), cfg)
    pvalue, accepted = ruled_pvalue(engine, ids, cfg, lambda: None, exact)
    assert pvalue > ALPHA, pvalue
    assert method == "none" or accepted > 0


def test_the_check_rejects_penalties_that_ignore_the_path(setup):
    target, draft, ids = setup
    cfg = SamplingConfig(**CFG)
    exact = exact_ruled_joint(target, ids, cfg, lambda: Penalties(-2.0, -2.0))
    # the rejection rule (a seeded request's keyed draws take the same rows)
    engine = Engine(target, DRAFTERS["draft"](target, draft, cfg), cfg, keyed_seeds=False)
    pvalue, _ = ruled_pvalue(engine, ids, cfg, lambda: CommittedOnly(-2.0, -2.0), exact)
    assert pvalue < ALPHA / 100, pvalue


class FixedQ(Drafter):
    """A sampling drafter that proposes one token a step, drawn from a fixed ``q`` (its row for
    the root; the draft is a child of the root)."""

    name = "fixed-q"

    def __init__(self, q: np.ndarray):
        self.q, self.history, self.rng = q, [], np.random.default_rng(0)

    def prefill(self, tokens, target_out, sampling):
        self.history = list(tokens)
        self.rng = np.random.default_rng([sampling.seed or 0, 7])

    def propose(self, budget):
        if budget <= 0:
            return DraftTree.chain(self.history[-1], [])
        x = int(self.rng.choice(len(self.q), p=self.q))
        return DraftTree.chain(self.history[-1], [x], np.stack([self.q, np.zeros_like(self.q)]))

    def update(self, accepted, tree, target_out):
        self.history.extend(accepted.tokens)

    def reset(self):
        self.history = []


def _banned_rule_and_q(target, ids, cfg):
    """A rule banning the target's likeliest first token ``b``, a run forced after the next
    likeliest ``x``, and a q with most of its mass on ``b`` and the rest, ``p'(x)``, on ``x``
    (p' the ruled target's row). The masked q is the one-hot of ``x``, accepted with
    probability ``p'(x)``; the unmasked one accepts ``x`` whenever it is drawn: x comes out with
    probability p'(x)(2 - p'(x)) instead of p'(x)."""
    p = probs(logits_from_scratch(target, ids)[-1], cfg)
    b, x = np.argsort(-p)[:2]
    def make():  # after x, the banned b is forced
        return BanAndForce({int(b)}, int(x), [int(b)])

    rule = make()
    rule.reset(ids)
    row = mx.array(logits_from_scratch(target, ids)[-1:])
    pr = probs(np.array(rule.apply(DraftTree.chain(ids[-1], []), row)), cfg)[0]
    q = np.zeros_like(pr)
    q[b], q[x] = 1.0 - pr[x], pr[x]
    return make, q


@pytest.mark.parametrize("mask", [True, False])
def test_cut_sampled_drafts_need_their_q_masked(setup, monkeypatch, mask):
    target, _, ids = setup
    cfg = SamplingConfig(**CFG)
    make, q = _banned_rule_and_q(target, ids, cfg)
    if not mask:
        monkeypatch.setattr(edgespec.engine, "masked_q", lambda tree, logits: tree)
    exact = exact_ruled_joint(target, ids, cfg, make)
    # q matters to the rejection rule only (the keyed rule accepts a draft when it is the
    # token drawn, whatever q says)
    pvalue, accepted = ruled_pvalue(Engine(target, FixedQ(q), cfg, keyed_seeds=False), ids, cfg,
                                    make, exact)
    if mask:
        assert pvalue > ALPHA and accepted > 0, (pvalue, accepted)
    else:
        assert pvalue < ALPHA / 100, pvalue


# --- the server ---------------------------------------------------------------------------------

def test_server_penalties_change_the_output_and_every_method_agrees(client, live):
    plain = chat(client, max_tokens=16, extra_body={"method": "none"}).choices[0].message.content
    asked = {"frequency_penalty": 1.0, "presence_penalty": 0.5,
             "extra_body": {"repetition_penalty": 1.3}}
    want = chat(client, max_tokens=16, **{**asked, "extra_body": {**asked["extra_body"],
                                                                "method": "none"}})
    assert want.choices[0].message.content != plain
    for method in ("draft", "lookup", "lookahead"):
        got = chat(client, max_tokens=16, **{**asked, "extra_body": {**asked["extra_body"],
                                                                   "method": method}})
        assert got.choices[0].message.content == want.choices[0].message.content, method
    r = httpx.post(live.url + "/v1/chat/completions",
                   json={"messages": HI, "presence_penalty": 2.5})
    assert_error(r, 400)
    assert "presence_penalty must be a number in [-2, 2], got 2.5" in r.json()["error"]["message"]
