"""DraftTree and the tree math of ``tree.py``: properties on random trees, checked against
reference definitions written out here (walk the parents; test every key against every query),
plus the awkward cases (a root alone, the sliding-window boundary, positions after compaction).
"""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.errors import EdgespecError
from edgespec.tree import DraftTree, attention_mask, chain_mask, merge

SEEDS = range(40)


def random_tree(rng: np.random.Generator, n_max: int = 12, vocab: int = 4) -> DraftTree:
    """A random tree (parents drawn among earlier nodes) over a small vocabulary, so that
    siblings with equal tokens and shared prefixes across trees are common."""
    n = int(rng.integers(1, n_max + 1))
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    return DraftTree([9] + [int(t) for t in rng.integers(0, vocab, n - 1)], parents)


def ancestors_or_self(tree: DraftTree, u: int) -> set[int]:
    out = {u}
    while tree.parents[u] >= 0:
        u = tree.parents[u]
        out.add(u)
    return out


def token_paths(tree: DraftTree) -> set[tuple[int, ...]]:
    """Every root-to-node path, as token sequences (what a merge must keep)."""
    return {tuple(tree.tokens[v] for v in tree.path_to(u)) for u in range(len(tree))}


def reference_mask(tree: DraftTree, key_positions, root_position: int, window: int | None) -> np.ndarray:
    """Query i (at root_position + depth) sees cached key j, or tree node j when j is an ancestor
    of i or i itself, provided the key lies within the window: 0 <= pos(i) - pos(j) < window."""
    depth = [len(ancestors_or_self(tree, u)) - 1 for u in range(len(tree))]
    q_pos = [root_position + d for d in depth]
    keys = [(int(p), None) for p in key_positions] + [(q_pos[j], j) for j in range(len(tree))]
    m = np.zeros((len(tree), len(keys)), dtype=bool)
    for i in range(len(tree)):
        for c, (k_pos, node) in enumerate(keys):
            related = node is None or node in ancestors_or_self(tree, i)
            m[i, c] = related and (window is None or q_pos[i] - k_pos < window)
    return m


# --- the tree itself ----------------------------------------------------------------------------

def test_chain_is_the_lower_triangle():
    t = DraftTree.chain(5, [7, 8, 9])
    assert t.tokens == [5, 7, 8, 9] and t.parents == [-1, 0, 1, 2]
    assert t.is_chain and t.num_drafted == 3 and len(t) == 4
    assert t.depths().tolist() == [0, 1, 2, 3]
    assert (t.ancestor_mask() == np.tril(np.ones((4, 4), dtype=bool))).all()
    assert t.leaves() == [3] and t.path_to(3) == [0, 1, 2, 3]
    assert [t.children(u) for u in range(4)] == [[1], [2], [3], []]


def test_root_only():
    t = DraftTree.chain(3, [])
    assert t.is_chain and t.num_drafted == 0 and t.depths().tolist() == [0]
    assert t.ancestor_mask().tolist() == [[True]]
    assert t.children(0) == [] and t.leaves() == [0] and t.path_to(0) == [0]


def test_branching_tree_by_hand():
    # 0 ─┬─ 1 ── 3
    #    └─ 2 ─┬─ 4
    #          └─ 5
    t = DraftTree([0, 10, 20, 11, 21, 22], [-1, 0, 0, 1, 2, 2])
    assert not t.is_chain
    assert t.depths().tolist() == [0, 1, 1, 2, 2, 2]
    assert t.children(2) == [4, 5] and t.leaves() == [3, 4, 5]
    assert t.path_to(5) == [0, 2, 5]
    assert np.flatnonzero(t.ancestor_mask()[5]).tolist() == [0, 2, 5]


@pytest.mark.parametrize("tokens, parents", [([], []), ([1, 2], [0, 0]), ([1, 2, 3], [-1, 2, 0]),
                                             ([1, 2], [-1, 1]), ([1, 2], [-1])])
def test_malformed_trees_are_refused(tokens, parents):
    with pytest.raises((AssertionError, EdgespecError)):
        DraftTree(tokens, parents)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_tree_properties(seed):
    t = random_tree(np.random.default_rng(seed))
    n, depths, mask = len(t), t.depths(), t.ancestor_mask()
    assert depths[0] == 0 and all(depths[u] == depths[t.parents[u]] + 1 for u in range(1, n))
    for u in range(n):
        assert t.children(u) == [v for v in range(n) if t.parents[v] == u]
        path = t.path_to(u)
        assert path[0] == 0 and path[-1] == u and len(path) == depths[u] + 1
        assert all(t.parents[b] == a for a, b in zip(path, path[1:]))
        assert set(np.flatnonzero(mask[u])) == ancestors_or_self(t, u)  # iff ancestor-or-self
    assert t.leaves() == [u for u in range(n) if not t.children(u)]
    assert t.is_chain == (t.parents == list(range(-1, n - 1)))
    assert (mask.sum(1) == depths + 1).all()
    assert (np.triu(mask, 1) == 0).all()  # parents precede children: nothing above the diagonal


# --- merge (trie union) -----------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_merge_keeps_every_path_once(seed):
    rng = np.random.default_rng(seed)
    trees = [random_tree(rng) for _ in range(int(rng.integers(1, 4)))]
    m = merge(trees)
    union = set().union(*(token_paths(t) for t in trees))
    assert token_paths(m) == union  # every path of every input, and nothing else
    assert len(m) == len(union)  # shared prefixes (and equal siblings) stored once
    assert m.q is None and m.source[0] == "root"
    assert len({(m.parents[u], m.tokens[u]) for u in range(1, len(m))}) == len(m) - 1


def test_merge_shares_the_common_prefix_and_labels_sources():
    a = DraftTree.chain(1, [2, 3, 4])
    b = DraftTree.chain(1, [2, 3, 5])
    b.source = ["root", "lookup", "lookup", "lookup"]
    m = merge([a, b])
    assert m.tokens == [1, 2, 3, 4, 5] and m.parents == [-1, 0, 1, 2, 2]
    assert m.source == ["root", "tree0", "tree0", "tree0", "lookup"]
    assert merge([a, a]).tokens == a.tokens and merge([a]).parents == a.parents


def test_merge_drops_q_and_needs_one_root():
    a = DraftTree.chain(1, [2], q=np.full((2, 4), 0.25))
    assert merge([a]).q is None  # merged nodes are verified as one-hot proposals
    with pytest.raises((AssertionError, EdgespecError)):
        merge([a, DraftTree.chain(7, [2])])


# --- attention masks ----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_attention_mask_matches_the_reference(seed):
    rng = np.random.default_rng(seed)
    t = random_tree(rng)
    start, n_cached = int(rng.integers(0, 50)), int(rng.integers(0, 20))
    keys = np.arange(start, start + n_cached)  # absolute positions: compaction moves `start`
    window = [None, 1, 2, 3, 5, 8, 40][seed % 7]
    got = attention_mask(t, keys, start + n_cached, window)
    want = reference_mask(t, keys, start + n_cached, window)
    if got is None:  # nothing masked: the reference agrees that every key is visible
        assert want.all()
    else:
        assert got.shape == want.shape and (got == want).all()


def test_mask_without_window_is_cached_keys_plus_ancestors():
    t = DraftTree([0, 1, 2, 3], [-1, 0, 0, 2])
    m = attention_mask(t, np.arange(5), 5, None)
    assert m.shape == (4, 9) and m[:, :5].all()
    assert (m[:, 5:] == t.ancestor_mask()).all()


def test_root_only_is_unmasked_unless_a_key_left_the_window():
    root = DraftTree.chain(0, [])
    assert attention_mask(root, np.arange(10), 10, None) is None
    assert attention_mask(root, np.arange(0), 0, 4) is None  # nothing cached yet
    assert attention_mask(root, np.arange(7, 10), 10, 4) is None  # oldest key 3 back: inside
    m = attention_mask(root, np.arange(6, 10), 10, 4)  # oldest key 4 back: outside
    assert m.tolist() == [[False, True, True, True, True]]


def test_window_boundary_is_exclusive_at_window_positions_back():
    """A query at P sees keys at P - window + 1 .. P, and for tree nodes the depth counts."""
    window, keys = 3, np.arange(20, 30)  # cached keys at absolute positions 20..29
    m = chain_mask(3, keys, 30, window)  # new tokens at positions 30, 31, 32
    for i, pos in enumerate((30, 31, 32)):
        visible = [p for p in range(20, 33) if 0 <= pos - p < window]
        assert [20 + j for j in np.flatnonzero(m[i])] == visible
    # on a branch the window is measured along positions, not node indices
    t = DraftTree([0, 1, 2, 3], [-1, 0, 0, 2])  # node 3 at depth 2
    row = attention_mask(t, keys, 30, window)[3]
    assert np.flatnonzero(row).tolist() == [10, 12, 13]  # root (30), node 2 (31), itself (32)
    assert not row[11]  # node 1 is at 31 too, but a sibling's branch, not an ancestor


def test_chain_mask_is_the_chain_trees_mask():
    keys = np.arange(4, 9)
    for n, window in [(1, None), (4, None), (6, 3), (2, 8)]:
        tree = DraftTree.chain(0, list(range(1, n)))
        got, want = chain_mask(n, keys, 9, window), attention_mask(tree, keys, 9, window)
        assert (got is None and want is None) or (got == want).all()
    m = chain_mask(5, np.arange(0), 0, None)  # a prefill chunk from scratch: causal
    assert (m == np.tril(np.ones((5, 5), dtype=bool))).all()
