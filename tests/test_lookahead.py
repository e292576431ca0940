"""Lookahead decoding: the pool, the Jacobi window, its mask, budgets, exactness on tiny models."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec import Engine
from edgespec.drafters.lookahead import JacobiWindow, LookaheadDrafter, NgramPool
from edgespec.errors import ConfigError
from edgespec.targets.target import TargetOutput
from edgespec.tree import DraftTree
from edgespec.verify import Accepted

from .tiny import KINDS

V = 50


def test_pool_keeps_most_recent_distinct_tails_per_first_token():
    pool = NgramPool(g=2)
    for gram in [(1, 2, 3), (1, 4, 5), (1, 2, 3), (1, 6, 7), (9, 9, 9)]:
        pool.add(gram)
    assert pool.get(1) == [(6, 7), (2, 3)]
    assert pool.get(9) == [(9, 9)]
    assert pool.get(2) == []


def test_window_mask_is_the_lookahead_mask():
    win = JacobiWindow([10, 11, 12], n=4)
    win.advance([20, 21, 22])
    win.advance([30, 31, 32])
    tree, idx = win.attach(DraftTree.chain(7, []))
    assert idx.shape == (3, 3) and win.depth == 5 and win.size == 9
    depth, mask = tree.depths(), tree.ancestor_mask()
    for l in range(3):
        for i in range(3):
            u = idx[l, i]
            assert depth[u] == 1 + i + l
            # sees the root, level 0 up to its column, and its own column above it
            row0 = {int(idx[0, j]) for j in range(i + 1)}
            column = {int(idx[m, i]) for m in range(l + 1)}
            expect = {0} | row0 | column
            assert set(np.flatnonzero(mask[u]).tolist()) == expect


def _one_hot_out(n_nodes: int, rows: dict[int, int]) -> TargetOutput:
    logits = np.zeros((n_nodes, V), dtype=np.float32)
    for u, t in rows.items():
        logits[u, t] = 5.0
    return TargetOutput(mx.array(logits), mx.zeros((n_nodes, 4)))


def test_jacobi_steps_fill_the_pool_from_trajectories():
    d = LookaheadDrafter(window=2, ngram=3, guesses=2, from_history=False)
    d.prefill([1, 2, 3, 4], None)
    first = [7, 8]
    d.window = JacobiWindow(first, n=3)
    tree = d.propose(budget=10)  # level 0 only: a chain of W under the root
    assert tree.parents == [-1, 0, 1] and tree.tokens[1:] == first
    d.update(Accepted([0], [5]), tree, _one_hot_out(len(tree), {1: 40, 2: 41}))
    assert d.window.levels == [first, [40, 41]] and len(d.pool) == 0
    tree = d.propose(budget=10)  # two levels: chain + one token per column
    last = d._window_nodes[-1]
    out = _one_hot_out(len(tree), {int(last[0]): 42, int(last[1]): 43})
    d.update(Accepted([0], [6]), tree, out)
    assert d.window.levels == [[40, 41], [42, 43]]
    assert d.pool.get(7) == [(40, 42)] and d.pool.get(8) == [(41, 43)]
    # the harvested n-gram is proposed when its first token becomes the root
    d._commit([8])
    tree = d.propose(budget=10)
    branch = [tree.tokens[u] for u in tree.path_to(2)]
    assert branch == [8, 41, 43] and tree.source[1] == "pool"


def test_budget_and_tree_size_are_respected():
    d = LookaheadDrafter()  # W=4, N=4, G=4
    rng = np.random.default_rng(0)
    d.prefill(rng.integers(0, 8, 200).tolist(), None)  # small alphabet: a full pool
    for _ in range(5):
        tree = d.propose(budget=20)
        n = len(tree)
        out = _one_hot_out(n, {u: int(rng.integers(0, 8)) for u in range(n)})
        d.update(Accepted([0], [int(rng.integers(0, 8))]), tree, out)
    assert len(d.window.levels) == 3
    for budget in (0, 1, 2, 3, 5, 6, 20):
        tree = d.propose(budget)
        assert tree.depths().max() <= budget
        assert len(tree) <= 32
    assert len(d.propose(20)) > 1 + 12  # pool branches + the full window
    with pytest.raises(ConfigError, match="max_nodes"):
        LookaheadDrafter(window=8, ngram=5, guesses=4)
    with pytest.raises(ConfigError, match="ngram"):
        LookaheadDrafter(ngram=1)


REPETITIVE = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"


TARGET_KINDS = tuple(KINDS)  # conftest's `target`: every test once per model kind


@pytest.mark.parametrize("from_history", [False, True])
def test_lookahead_greedy_is_exact(target, from_history):
    for prompt in (REPETITIVE, "Once upon a time, in a land far away"):
        plain = Engine(target).generate(prompt, max_tokens=48)
        drafter = LookaheadDrafter(from_history=from_history)
        res = Engine(target, drafter).generate(prompt, max_tokens=48)
        assert res.token_ids == plain.token_ids
    assert res.stats.proposed > 0


def test_trajectory_pool_gets_drafts_accepted(target):
    # pool from Jacobi trajectories only: a random model soon loops, and the window catches it
    res = Engine(target, LookaheadDrafter(from_history=False)).generate(REPETITIVE, max_tokens=80)
    assert res.stats.accepted > 0


@pytest.mark.parametrize("sizes", [{}, {"window": 1, "ngram": 2}])
def test_a_budget_of_one_still_gets_pool_branches(target, sizes):
    # pool branches of one token always fit; with W=1, N=2 the window (one token under the
    # root) fits too. (Their sampling distribution: test_lossless.py.)
    d = LookaheadDrafter(**sizes)
    d.prefill(Engine(target).encode(REPETITIVE), None)
    assert "pool" in d.propose(1).source and ("lookahead" in d.propose(1).source) == bool(sizes)
