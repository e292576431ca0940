"""EAGLE-3 drafting on tiny random models: greedy output equals plain decoding with a random head
(prompts, node budgets, a prompt longer than a prefill chunk, prefix reuse across calls with the
same and with a fresh drafter), an oracle head gets everything accepted, the engine hands the
aux layers' features to the drafter, the cost-curve sizing runs. Sampling: test_lossless.py."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec import Engine
from edgespec.drafters.eagle3 import Eagle3Drafter
from edgespec.heads import Eagle3Head, HeadConfig
from edgespec.kernels.tree_mask import TreeMask
from edgespec.targets.cost import CostCurve
from edgespec.tree import DraftTree

from .tiny import KINDS

TARGET_KINDS = tuple(KINDS)
PROMPTS = ["the cat sat on the mat and then", "hello there, hello there, hello",
           [{"role": "user", "content": "tell me about the cat"}]]
FLAT = CostCurve((1, 64), (10.0, 10.0))  # verifying is free beyond the first node: big trees


def random_head(target, seed: int = 0, **kw) -> Eagle3Head:
    mx.random.seed(seed)
    head = Eagle3Head(HeadConfig.for_target(target, "eagle3", **kw))
    mx.eval(head.parameters())
    return head


class OracleHead(Eagle3Head):
    """Knows the target's greedy continuation ``seq``: the row at pair position p predicts
    seq[p + 2], as a perfectly trained head would. Its output hidden state carries p (column 0),
    so ``logits`` of any row it produced knows what to predict."""

    def __init__(self, target, seq: list[int]):
        super().__init__(HeadConfig.for_target(target, "eagle3"))
        self.seq = seq

    def step(self, emb, h, positions, mask, cache, layer_slot: int = 0, last=None):
        n = emb.shape[0]
        cache.reserve(n)  # the real head writes its keys; the drafter's bookkeeping is the same
        if isinstance(mask, TreeMask):  # its positions are the rows'
            positions = mask.qpos
        pos = np.arange(positions, positions + n) if np.isscalar(positions) else np.asarray(positions)
        out = mx.zeros((n, emb.shape[1])) + mx.array(pos, dtype=mx.float32)[:, None]
        return self.logits(out if last is None else out[n - last :]), out

    def logits(self, out):
        pos = np.array(out[:, 0]).astype(int)
        want = [self.seq[p + 2] if p + 2 < len(self.seq) else 0 for p in pos]
        rows = np.zeros((len(pos), self.config.draft_vocab_size), dtype=np.float32)
        rows[np.arange(len(pos)), want] = 30.0
        return mx.array(rows)


@pytest.mark.parametrize("nodes", [1, 3, 10])
def test_random_head_keeps_greedy_output(target, nodes):
    head = random_head(target)
    for prompt in PROMPTS:
        plain = Engine(target).generate(prompt, max_tokens=20)
        res = Engine(target, Eagle3Drafter(target, head, None, nodes=nodes)).generate(prompt, max_tokens=20)
        assert res.token_ids == plain.token_ids
        assert res.stats.proposed > 0


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_head_keeps_greedy_output_and_drafts_like_the_float_one(target, bits):
    """A head quantized for drafting (``head_bits``): same greedy output as plain decoding, a
    reduced draft vocabulary kept, its logits near the float head's, and its drafts mostly the
    float head's (quantization changes draft quality only)."""
    from edgespec.heads.eagle3 import quantized_head

    head = random_head(target, draft_vocab_size=64)
    head.set_draft_vocab(np.arange(100, 164))
    q = quantized_head(head, bits)
    assert type(q.layer.self_attn.q_proj).__name__ == "QuantizedLinear" and q.layer.self_attn.q_proj.bits == bits
    assert np.array_equal(np.array(q.to_target_ids(np.arange(64))), np.arange(100, 164))
    H = target.args.hidden_size
    rng = np.random.default_rng(0)
    emb, h = (mx.array(rng.standard_normal((5, H)).astype(np.float32)) for _ in range(2))
    want, _ = head.step(emb, h, 0, None, head.make_cache())
    got, _ = q.step(emb, h, 0, None, q.make_cache())
    err = float(mx.abs(got - want).max() / mx.abs(want).max())
    assert err < (0.05 if bits == 8 else 0.3)
    feats = mx.array(rng.standard_normal((3, 3 * H)).astype(np.float32))
    assert float(mx.abs(q.fuse_rows(feats) - head.fuse(feats)).max()) < 0.5 * float(mx.abs(head.fuse(feats)).max())
    for prompt in PROMPTS:
        plain = Engine(target).generate(prompt, max_tokens=20)
        res = Engine(target, Eagle3Drafter(target, q, None, nodes=4)).generate(prompt, max_tokens=20)
        assert res.token_ids == plain.token_ids
        assert res.stats.proposed > 0


def test_head_bits_default_follows_the_native_kernels(target, monkeypatch):
    """``head_bits`` None: 8-bit where the native kernels run the products, else the float head;
    0 always the float head; the quantized copy is made once per head and bits."""
    from edgespec.heads.loaded import head_in_bits

    head = random_head(target)
    monkeypatch.setattr("edgespec.kernels.backend.native_enabled", lambda: True)
    q = head_in_bits(target, head, None)
    assert q is not head and q.layer.mlp.gate_proj.bits == 8
    assert head_in_bits(target, head, 8) is q
    assert head_in_bits(target, head, 4).layer.mlp.gate_proj.bits == 4
    assert head_in_bits(target, head, 0) is head
    monkeypatch.setattr("edgespec.kernels.backend.native_enabled", lambda: False)
    assert head_in_bits(target, head, None) is head


def test_reduced_draft_vocabulary_keeps_greedy_output(target):
    head = random_head(target, draft_vocab_size=64)
    head.set_draft_vocab(np.arange(100, 164))
    plain = Engine(target).generate(PROMPTS[0], max_tokens=16)
    res = Engine(target, Eagle3Drafter(target, head, None, nodes=6)).generate(PROMPTS[0], max_tokens=16)
    assert res.token_ids == plain.token_ids
    assert all(100 <= t < 164 for s in res.steps for t in s.token_ids[: s.accepted])


def test_oracle_head_gets_every_draft_accepted(target):
    prompt = PROMPTS[0]
    ids = Engine(target).encode(prompt)
    plain = Engine(target).generate(ids, max_tokens=30)
    head = OracleHead(target, ids + plain.token_ids)
    for nodes in (1, 4):
        res = Engine(target, Eagle3Drafter(target, head, None, nodes=nodes)).generate(ids, max_tokens=30)
        assert res.token_ids == plain.token_ids
        assert res.stats.accepted == res.stats.proposed - sum(
            s.proposed - s.accepted for s in res.steps)  # bookkeeping
        # every step but the last verifies a chain of `nodes` right guesses
        assert all(s.accepted == nodes == s.proposed for s in res.steps[:-1])
        assert res.stats.target_forwards == -(-30 // (nodes + 1))


@pytest.mark.parametrize("curve", [None, FLAT])
def test_sure_lookup_steps_draft_alone_and_keep_greedy_output(target, curve):
    """With ``lookup``, a step whose prompt-lookup match is sure drafts lookup's branch alone
    (no head forward); the head takes those steps' pairs in one forward when it next drafts.
    The output stays plain decoding's; the head's calibration sees only its own trees; lookup
    learns from its own branches; the head's cache ends holding every committed pair."""
    from edgespec.drafters.lookup import PromptLookupDrafter

    head = random_head(target)
    text = "one two three four five six seven eight. one two three four five six seven eight. one"
    for prompt in [text, PROMPTS[1]]:
        plain = Engine(target).generate(prompt, max_tokens=40)
        lookup = PromptLookupDrafter()
        drafter = Eagle3Drafter(target, head, curve, nodes=None if curve else 3, lookup=lookup)
        kinds, observed, forwards = [], [], []
        propose, observe, step = drafter.propose, drafter.calibration.observe_tree, head.step

        def spy(budget):
            sure = lookup.confident()
            before = len(forwards)
            tree = propose(budget)
            kinds.append(sure)
            if sure:  # lookup's branch alone, no head forward
                assert len(forwards) == before and drafter._own is False
            return tree

        def spy_observe(tree, confidence, path):
            observed.append(tree)
            return observe(tree, confidence, path)

        drafter.propose, drafter.calibration.observe_tree = spy, spy_observe
        head.step = lambda *a, **kw: forwards.append(1) or step(*a, **kw)
        try:
            res = Engine(target, drafter).generate(prompt, max_tokens=40)
        finally:
            del head.step
        assert res.token_ids == plain.token_ids
        assert any(kinds), "no sure lookup step"
        assert len(observed) <= kinds.count(False)
        drafter._flush()
        ids = Engine(target).encode(prompt) + res.token_ids
        assert drafter.base + drafter.cache.offset == len(ids) - 1  # every committed pair but the last
    assert lookup.index.tokens[-len(res.token_ids) + 1 :] == res.token_ids[:-1]


def test_oracle_head_sized_by_a_flat_cost_curve_drafts_deep(target):
    ids = Engine(target).encode(PROMPTS[1])
    plain = Engine(target).generate(ids, max_tokens=30)
    drafter = Eagle3Drafter(target, OracleHead(target, ids + plain.token_ids), FLAT, max_nodes=16)
    res = Engine(target, drafter).generate(ids, max_tokens=30)
    assert res.token_ids == plain.token_ids
    assert res.steps[0].accepted == drafter.max_depth  # a sure chain pays to its full depth
    assert res.stats.target_forwards <= 5



def test_a_depth_is_grown_only_when_its_forward_pays(target):
    """``_deeper_pays``: the frontier's estimated children against one more head forward's cost,
    on the same curve; greedy output stays plain decoding's whichever way it goes."""
    drafter = Eagle3Drafter(target, random_head(target), FLAT, top_k=2)
    parents, conf = [-1, 0, 0], [1.0, 0.9, 0.05]  # two depth-1 children of the root

    def pays():  # as ``propose`` asks: against the rate of its cut without the next depth
        return drafter._deeper_pays(parents, conf, [1], 0, drafter._cut(parents, conf, 0)[1].rate)

    assert pays()  # nothing measured yet: it expands
    drafter.depth_ms, drafter.update_ms = 1.0, 1.0
    drafter.child_edges = np.array([0.9, 0.05])  # children have been likely: worth 1 ms
    assert pays()
    drafter.depth_ms = 50.0  # a forward costing 5 verifications is not
    assert not pays()
    drafter.depth_ms, drafter.child_edges = 1.0, np.array([0.001, 0.001])  # nor unlikely children
    assert not pays()
    drafter.held_back = 0
    for _ in range(16):  # held back at depth 1 step after step ...
        assert not pays()
    assert pays()  # ... until one forward re-measures
    assert not pays()
    drafter.child_edges = None
    drafter._learn_child_edges(np.array([[0.2, 0.9], [0.5, 0.1]]))  # rows: parents
    edges = drafter.calibration(np.array([[0.9, 0.2], [0.5, 0.1]])).mean(axis=0)
    assert np.allclose(drafter.child_edges, edges) and edges[0] >= edges[1]
    ids = Engine(target).encode(PROMPTS[0])
    plain = Engine(target).generate(ids, max_tokens=20)
    slow = Eagle3Drafter(target, random_head(target), FLAT)
    res = Engine(target, slow).generate(ids, max_tokens=20)
    assert res.token_ids == plain.token_ids and slow.child_edges is not None

def test_prompt_longer_than_a_prefill_chunk(target):
    prompt = " ".join(f"word{i % 37}" for i in range(300))  # > 512 tokens
    ids = Engine(target).encode(prompt)
    assert len(ids) > 600
    plain = Engine(target).generate(ids, max_tokens=12)
    oracle = OracleHead(target, ids + plain.token_ids)
    for head in (random_head(target), oracle):
        res = Engine(target, Eagle3Drafter(target, head, None, nodes=3)).generate(ids, max_tokens=12)
        assert res.token_ids == plain.token_ids
    assert res.stats.acceptance_rate == 1.0  # the oracle: the head saw every prompt pair


def test_prefix_reuse_across_calls_same_and_fresh_drafter(target):
    first = Engine(target).encode(PROMPTS[0])
    answer = Engine(target).generate(first, max_tokens=10).token_ids
    second = first + answer + Engine(target).encode(" and the dog")
    want = Engine(target).generate(second, max_tokens=16).token_ids
    full = second + want
    head = random_head(target)
    engine = Engine(target, Eagle3Drafter(target, head, None, nodes=4))
    assert engine.generate(first, max_tokens=10).token_ids == answer
    res = engine.generate(second, max_tokens=16)  # the same drafter: its cache is kept
    assert res.token_ids == want and res.stats.cached_tokens > 0
    engine.drafter = Eagle3Drafter(target, OracleHead(target, full), None, nodes=4)  # a fresh one
    res = engine.generate(second, max_tokens=16)
    assert res.token_ids == want and res.stats.cached_tokens == len(second) - 1
    assert res.stats.acceptance_rate == 1.0  # it drafts from its first verification on


def test_engine_hands_the_aux_features_to_the_drafter(target):
    seen = {}

    class Spy(Eagle3Drafter):
        def prefill(self, tokens, target_out, sampling=None):
            seen["prefill"] = {i: target_out.captured[i].shape for i in self.target_features}
            super().prefill(tokens, target_out, sampling)

        def update(self, accepted, tree, target_out):
            seen.setdefault("update", set()).add(
                all(target_out.captured[i].shape[0] == len(tree) for i in self.target_features))
            super().update(accepted, tree, target_out)

    ids = Engine(target).encode(PROMPTS[0])
    drafter = Spy(target, random_head(target), None, nodes=3)
    Engine(target, drafter).generate(ids, max_tokens=6)
    H = target.args.hidden_size
    assert seen["prefill"] == {i: (len(ids) - 1, H) for i in drafter.target_features}
    assert seen["update"] == {True}


def test_plain_decoding_captures_nothing(target, monkeypatch):
    calls = []
    real = type(target).score

    def spy(self, tokens, cache, **kw):
        calls.append(kw.get("capture", ()))
        return real(self, tokens, cache, **kw)

    monkeypatch.setattr(type(target), "score", spy)
    Engine(target).generate(PROMPTS[0], max_tokens=4)
    assert calls and all(tuple(c) == () for c in calls)


class Alternating(Eagle3Drafter):
    """Proposes only every third step (an empty tree otherwise, as ``auto`` gives an arm it did
    not choose); counts the head forwards each update makes."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.steps, self.update_forwards = 0, []
        real = self.head.step

        def counted(*args, **kwargs):
            self.forwards += 1
            return real(*args, **kwargs)

        self.forwards = 0
        self.head.step = counted

    def propose(self, budget):
        self.steps += 1
        if self.steps % 3:
            return DraftTree.chain(self.history[-1], [])
        return super().propose(budget)

    def update(self, accepted, tree, target_out):
        before = self.forwards
        super().update(accepted, tree, target_out)
        self.update_forwards.append((tree is not None and tree.num_drafted > 0, self.forwards - before))


def test_steps_of_another_drafter_are_fed_in_one_go_when_it_next_proposes(target):
    ids = Engine(target).encode(PROMPTS[0])
    plain = Engine(target).generate(ids, max_tokens=30)
    drafter = Alternating(target, OracleHead(target, ids + plain.token_ids), None, nodes=3)
    res = Engine(target, drafter).generate(ids, max_tokens=30)
    assert res.token_ids == plain.token_ids
    drafted = [s for s in res.steps if s.proposed]
    assert len(drafted) >= 3 and all(s.accepted == s.proposed for s in drafted[:-1])
    # an update after another drafter's step runs no head forward; one after its own does
    assert {n for own, n in drafter.update_forwards if not own} == {0}
    assert all(n > 0 for own, n in drafter.update_forwards if own)
