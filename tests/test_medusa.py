"""Medusa drafting on tiny random models: greedy output equals plain decoding with random heads
(prompts, node budgets, a prompt longer than a prefill chunk, prefix reuse), oracle heads get
everything accepted, the static tree's shape is data chosen from per-head accuracy and the cost
curve. Sampling: test_lossless.py."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from edgespec import Engine
from edgespec.drafters.medusa import DEFAULT_SHAPE, MedusaDrafter, choose_shape, product_tree
from edgespec.heads import HeadConfig, MedusaHeads
from edgespec.heads.medusa import target_lm_head
from edgespec.targets.cost import CostCurve

from .tiny import KINDS

TARGET_KINDS = tuple(KINDS)
PROMPTS = ["the cat sat on the mat and then", "hello there, hello there, hello",
           [{"role": "user", "content": "tell me about the cat"}]]
STEEP = CostCurve((1, 2, 64), (10.0, 20.0, 640.0))  # every node costs a whole forward
FLAT = CostCurve((1, 64), (10.0, 10.0))


def random_heads(target, k: int = 3, own: bool = True, from_target: bool = False) -> MedusaHeads:
    mx.random.seed(1)
    heads = MedusaHeads(HeadConfig.for_target(target, "medusa", num_heads=k, own_lm_head=own))
    if from_target:
        heads.init_from_target(target)
    mx.eval(heads.parameters())
    return heads


class OracleHeads(MedusaHeads):
    """Head i maps the normed hidden state of position t (found by nearest neighbour among the
    target's own states along ``seq``) to seq[t + 2 + i]: perfectly trained heads."""

    def __init__(self, target, seq: list[int], k: int = 3):
        super().__init__(HeadConfig.for_target(target, "medusa", num_heads=k))
        out = target.score(seq, target.make_cache(), head=False)
        states = np.array(target.model.model.norm(out.hidden))
        self.heads = [OracleHead(states, seq, i, self.config.vocab_size) for i in range(k)]


def test_shared_lm_head_in_one_product_equals_the_heads_own_call(target):
    heads = random_heads(target, k=3, own=False)
    for block in (h.blocks[0] for h in heads.heads):  # non-trivial blocks
        block.linear.weight = mx.random.normal(block.linear.weight.shape) * 0.1
    drafter = MedusaDrafter(target, heads, None, nodes=3)
    x = mx.random.normal((1, target.args.hidden_size))
    want = heads(x, target_lm_head(target))[:2, 0]
    assert mx.allclose(drafter._logits(x, 2), want, atol=1e-4)


class OracleHead(nn.Module):
    def __init__(self, states: np.ndarray, seq: list[int], i: int, vocab: int):
        super().__init__()
        self._states, self._seq, self._i, self._vocab = states, seq, i, vocab

    def __call__(self, normed, target_head=None):
        rows = np.zeros((normed.shape[0], self._vocab), dtype=np.float32)
        for r, row in enumerate(np.array(normed)):
            p = self._position(row) + 2 + self._i
            rows[r, self._seq[p] if p < len(self._seq) else 0] = 30.0
        return mx.array(rows)

    def _position(self, row: np.ndarray) -> int:
        """The first position with the nearest state (a windowed model repeating one token
        reaches the same state again and again, and then goes on the same way)."""
        d = np.sqrt(((self._states - row) ** 2).sum(-1))
        return int(np.flatnonzero(d <= d.min() + 1e-3)[0])


@pytest.mark.parametrize("nodes", [1, 3, 10])
def test_random_heads_keep_greedy_output(target, nodes):
    for heads in (random_heads(target), random_heads(target, own=False, from_target=True)):
        for prompt in PROMPTS:
            plain = Engine(target).generate(prompt, max_tokens=20)
            res = Engine(target, MedusaDrafter(target, heads, None, nodes=nodes)).generate(
                prompt, max_tokens=20)
            assert res.token_ids == plain.token_ids
            assert res.stats.proposed > 0


def test_oracle_heads_get_every_draft_accepted(target):
    ids = Engine(target).encode(PROMPTS[0])
    plain = Engine(target).generate(ids, max_tokens=24)
    heads = OracleHeads(target, ids + plain.token_ids)
    for nodes in (1, 3):
        drafter = MedusaDrafter(target, heads, None, shape=(1, 1, 1), nodes=nodes)
        res = Engine(target, drafter).generate(ids, max_tokens=24)
        assert res.token_ids == plain.token_ids
        assert all(s.accepted == nodes == s.proposed for s in res.steps[:-1])


def test_oracle_heads_with_wider_shape_accept_the_true_branch(target):
    ids = Engine(target).encode(PROMPTS[1])
    plain = Engine(target).generate(ids, max_tokens=24)
    drafter = MedusaDrafter(target, OracleHeads(target, ids + plain.token_ids), FLAT,
                            shape=(3, 2, 1))
    res = Engine(target, drafter).generate(ids, max_tokens=24)
    assert res.token_ids == plain.token_ids
    assert all(s.accepted == 3 for s in res.steps[:-1])


def test_prompt_longer_than_a_chunk_and_prefix_reuse(target):
    long = Engine(target).encode(" ".join(f"word{i % 37}" for i in range(300)))
    assert len(long) > 600
    heads = random_heads(target)
    drafter = MedusaDrafter(target, heads, None, nodes=4)
    engine = Engine(target, drafter)
    answer = engine.generate(long, max_tokens=8).token_ids
    assert answer == Engine(target).generate(long, max_tokens=8).token_ids
    more = long + answer + Engine(target).encode(" again")
    res = engine.generate(more, max_tokens=12)
    assert res.token_ids == Engine(target).generate(more, max_tokens=12).token_ids
    assert res.stats.cached_tokens > len(long)
    engine.drafter = MedusaDrafter(target, heads, None, nodes=4)  # fresh: no state for the prefix
    res = engine.generate(more, max_tokens=12)
    assert res.token_ids == Engine(target).generate(more, max_tokens=12).token_ids


def test_product_tree_is_named_by_its_shape():
    parents, depth, rank = product_tree((3, 2, 1))
    assert len(parents) == 1 + 3 + 6 + 6
    assert depth.count(1) == 3 and depth.count(2) == 6 and depth.count(3) == 6
    assert [parents[u] for u in range(4, 10)] == [1, 1, 2, 2, 3, 3]
    assert rank[4:10] == [0, 1, 0, 1, 0, 1]


def test_shape_follows_accuracy_and_cost():
    sure = [[0.95, 0.99, 1.0, 1.0]] * 4  # top-1 nearly always right: a chain pays on any curve
    assert max(choose_shape(sure, STEEP, 4)) == 1  # each extra node costs a forward: a chain
    assert len(choose_shape(sure, FLAT, 4)) == 4  # nodes are free: as deep as the heads go
    unsure = [[0.3, 0.45, 0.55, 0.62, 0.68, 0.72, 0.75, 0.78]] * 4  # width pays on a flat curve
    wide, narrow = choose_shape(unsure, FLAT, 4), choose_shape(unsure, STEEP, 4)
    assert wide[0] > narrow[0] and np.prod(wide) > np.prod(narrow)
    assert len(choose_shape(unsure, FLAT, 2)) <= 2  # never deeper than the heads


def test_shape_from_the_recipe(target, tmp_path):
    heads = random_heads(target, k=4)
    (tmp_path / "recipe.json").write_text(json.dumps({"topk_accuracy": [[0.3, 0.45, 0.55, 0.62,
                                                       0.68, 0.72, 0.75, 0.78]] * 4}))
    assert MedusaDrafter(target, heads, FLAT, recipe_dir=tmp_path).shape == choose_shape(
        [[0.3, 0.45, 0.55, 0.62, 0.68, 0.72, 0.75, 0.78]] * 4, FLAT, 4)
    assert MedusaDrafter(target, heads, FLAT, recipe_dir=tmp_path / "none").shape == DEFAULT_SHAPE


def _vocab_heads(target, ids) -> MedusaHeads:
    """Random heads sharing the target's LM head, drafting only ``ids``."""
    mx.random.seed(2)
    c = HeadConfig.for_target(target, "medusa", num_heads=3, own_lm_head=False,
                              draft_vocab_size=len(ids))
    heads = MedusaHeads(c)
    for block in (h.blocks[0] for h in heads.heads):
        block.linear.weight = mx.random.normal(block.linear.weight.shape) * 0.1
    heads.set_draft_vocab(ids)
    mx.eval(heads.parameters())
    return heads


def test_a_draft_vocabulary_reads_its_rows_of_the_shared_head_and_stays_lossless(target):
    """The drafter's logits are the full-vocabulary logits' columns of ``draft_ids``; every
    proposed token is one of them; greedy output is plain decoding's."""
    V = target.args.vocab_size
    ids = np.arange(3, V, 3)
    heads = _vocab_heads(target, ids)
    drafter = MedusaDrafter(target, heads, None, nodes=4)
    x = mx.random.normal((1, target.args.hidden_size))
    full = heads(x, target_lm_head(target))[:2, 0]
    np.testing.assert_allclose(np.array(drafter._logits(x, 2)), np.array(full)[:, ids], atol=1e-4)
    out = target.score([5, 9, 11], target.make_cache())
    drafter.prefill([5, 9, 11], out)
    tree = drafter.propose(8)
    assert tree.num_drafted == 4 and set(tree.tokens[1:]) <= set(ids.tolist())
    for prompt in PROMPTS:
        plain = Engine(target).generate(prompt, max_tokens=16)
        res = Engine(target, MedusaDrafter(target, heads, None, nodes=4)).generate(
            prompt, max_tokens=16)
        assert res.token_ids == plain.token_ids and res.stats.proposed > 0
