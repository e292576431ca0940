"""Acceptance rules: greedy exactness and the sampling distribution (statistical tests).

The sampling tests use a toy target: a Markov chain P over a 5-token vocabulary, and a toy
drafter Q (a different Markov chain). Speculative steps with drafts drawn from Q, verified by
``verify_sampling``, must produce 3-token continuations distributed exactly as P's. A chi-square
test on 125 outcomes checks it, and the same test run on a deliberately wrong rule must fail,
which shows the test has the power to catch a broken rule.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from edgespec.sampling import sample
from edgespec.tree import DraftTree
from edgespec.verify import Accepted, verify_greedy, verify_sampling

V, L = 5, 3


def _markov(seed: int, sharp: float = 1.5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    m = rng.dirichlet(np.ones(V) * sharp, size=V)
    return m


P, Q = _markov(1), _markov(2, sharp=0.7)


def _draft_tree(root: int, rng, shape: str) -> DraftTree:
    """Drafts from Q: a chain of 3, or a tree with 2 i.i.d. children per node, depth 2."""
    tokens, parents = [root], [-1]
    frontier = [0]
    depth, width = (3, 1) if shape == "chain" else (2, 2)
    for _ in range(depth):
        nxt = []
        for u in frontier:
            for _ in range(width):
                tokens.append(sample(Q[tokens[u]], rng))
                parents.append(u)
                nxt.append(len(tokens) - 1)
        frontier = nxt
    q = np.stack([Q[t] for t in tokens])
    return DraftTree(tokens, parents, q)


def _generate(rule, shape: str, n: int, seed: int, one_hot: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = np.zeros(V**L)
    for _ in range(n):
        seq, last = [], 0
        while len(seq) < L:
            tree = _draft_tree(last, rng, shape)
            if one_hot:
                tree.q = None
            p = np.stack([P[t] for t in tree.tokens])
            acc = rule(tree, p, rng)
            seq.extend(acc.tokens)
            last = seq[-1]
        counts[np.ravel_multi_index(seq[:L], (V,) * L)] += 1
    return counts


def _exact() -> np.ndarray:
    pr = np.zeros((V,) * L)
    for idx in np.ndindex(*(V,) * L):
        prev, p = 0, 1.0
        for t in idx:
            p *= P[prev, t]
            prev = t
        pr[idx] = p
    return pr.ravel()


def _pvalue(counts: np.ndarray) -> float:
    expected = _exact() * counts.sum()
    keep = expected > 5  # chi-square needs enough expected mass per cell; pool the rest
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    return chisquare(obs, exp).pvalue


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("one_hot", [False, True])
def test_sampling_rule_matches_target_distribution(shape, one_hot):
    counts = _generate(verify_sampling, shape, 12000, seed=7, one_hot=one_hot)
    assert _pvalue(counts) > 1e-3


def _wrong_rule(tree: DraftTree, p: np.ndarray, rng) -> Accepted:
    """Accepts a draft whenever p(x) >= q(x) and otherwise resamples from p — biased."""
    u, path = 0, [0]
    while tree.children(u):
        c = tree.children(u)[0]
        x = tree.tokens[c]
        if p[u][x] < tree.q[u][x]:
            break
        u = c
        path.append(u)
    return Accepted(path, [tree.tokens[i] for i in path[1:]] + [sample(p[u], rng)])


def test_statistical_test_catches_a_wrong_rule():
    counts = _generate(_wrong_rule, "chain", 12000, seed=7)
    assert _pvalue(counts) < 1e-6


def test_greedy_walks_the_matching_branch():
    # root 9 -> children 1 (node 1), 2 (node 2); node 2 -> 3 (node 3), 4 (node 4)
    tree = DraftTree([9, 1, 2, 3, 4], [-1, 0, 0, 2, 2])
    argmax = np.array([2, 0, 4, 0, 7])
    acc = verify_greedy(tree, argmax)
    assert acc.path == [0, 2, 4] and acc.tokens == [2, 4, 7] and acc.num_accepted == 2
    assert verify_greedy(tree, np.array([5, 0, 0, 0, 0])).tokens == [5]


@pytest.mark.parametrize("filters", [{}, {"top_k": 7}, {"top_p": 0.8}, {"min_p": 0.05},
                                     {"top_k": 50, "top_p": 0.9, "min_p": 0.01}])
def test_row_probs_are_the_whole_arrays_rows(filters):
    """``accept`` computes a row of p only when the walk reads it: each row equals the row of
    ``probs`` over all of them, bit for bit, padded as asked; rows never read are never made."""
    from edgespec.config import SamplingConfig
    from edgespec.sampling import probs
    from edgespec.verify import RowProbs

    cfg = SamplingConfig(temperature=0.7, **filters)
    logits = (np.random.default_rng(3).standard_normal((6, 1000)) * 4).astype(np.float32)
    whole = probs(logits, cfg)
    lazy = RowProbs(logits, cfg, width=1024)
    assert len(lazy) == 6
    for u in (4, 0, 4):
        assert lazy[u].shape == (1024,) and np.array_equal(lazy[u][:1000], whole[u])
        assert not lazy[u][1000:].any()
    assert sorted(lazy._rows) == [0, 4]


def test_the_engine_sampling_walk_reads_only_the_rows_it_visits(monkeypatch):
    """On a chain of 5 drafts whose first is rejected for sure, the rule reads the root's row
    only (the bonus comes from its residual)."""
    import mlx.core as mx

    from edgespec.config import SamplingConfig
    from edgespec.verify import accept

    monkeypatch.setenv("EDGESPEC_METAL_KERNELS", "off")  # the host rule (kernels take every row)
    logits = np.full((6, 10), -30.0, dtype=np.float32)
    logits[:, 3] = 30.0  # every row: token 3 almost surely
    tree = DraftTree.chain(3, [5, 5, 5, 5, 5])  # draft 5 has probability ~e-60
    acc, p = accept(tree, mx.array(logits), SamplingConfig(temperature=1.0),
                    np.random.default_rng(0))
    assert acc.path == [0] and acc.tokens == [3]
    assert sorted(p._rows) == [0]
