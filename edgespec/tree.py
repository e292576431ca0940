"""DraftTree: the one currency between drafters and the verifier, and all tree math.

A draft tree is a list of token ids with a parent index per node. Node 0 is the root: the last
committed token, whose KV the target has not computed yet (it was the previous step's bonus
token). A chain of k drafts is the tree with parents ``[-1, 0, 1, ..., k-1]``. Everything the
target needs to score a tree in one pass (depths, positions, the ancestors-only mask) and
everything the cache needs to keep the accepted path is derived here from ``parents``.

``q`` is optional: row ``u`` of ``q`` (shape ``(N, V)``) is the distribution the drafter sampled
``u``'s children from. Deterministic drafters (prompt lookup, greedy drafts) leave it ``None``;
the verifier then treats each child as a one-hot proposal, which is still lossless.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class DraftTree:
    tokens: list[int]
    parents: list[int]
    q: np.ndarray | None = None  # (N, V) float; row u = distribution of u's children
    source: list[str] | None = None  # per node: which drafter proposed it (for merged trees)
    _children: list[list[int]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        assert len(self.tokens) == len(self.parents) >= 1, "a tree needs a root"
        assert self.parents[0] == -1, "node 0 must be the root"
        assert all(0 <= p < i for i, p in enumerate(self.parents) if i), "parents must precede children"

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, root: int, drafts: list[int], q: np.ndarray | None = None) -> DraftTree:
        tokens = [root, *drafts]
        return cls(tokens, list(range(-1, len(tokens) - 1)), q)

    @property
    def num_drafted(self) -> int:
        return len(self.tokens) - 1

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def children(self, u: int) -> list[int]:
        if self._children is None:
            kids: list[list[int]] = [[] for _ in self.tokens]
            for i, p in enumerate(self.parents[1:], start=1):
                kids[p].append(i)
            self._children = kids
        return self._children[u]

    def depths(self) -> np.ndarray:
        d = np.zeros(len(self), dtype=np.int32)
        for i, p in enumerate(self.parents[1:], start=1):
            d[i] = d[p] + 1
        return d

    def ancestor_mask(self) -> np.ndarray:
        """(N, N) bool: ``m[i, j]`` is True when j is i or an ancestor of i."""
        n = len(self)
        m = np.zeros((n, n), dtype=bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                m[i] = m[p]
            m[i, i] = True
        return m

    def path_to(self, u: int) -> list[int]:
        path = []
        while u >= 0:
            path.append(u)
            u = self.parents[u]
        return path[::-1]

    def leaves(self) -> list[int]:
        return [u for u in range(len(self)) if not self.children(u)]

    def window_rows(self, k: int) -> np.ndarray:
        """(N, k) int: per node, its k-1 nearest ancestors and itself, oldest first, as rows of
        a buffer whose first k-1 rows are the committed tokens' (row k-2 the latest) and whose
        row k-1+u is node u: the inputs a causal convolution of width k sees at each node."""
        rows = np.zeros((len(self), k), dtype=np.int32)
        for u, p in enumerate(self.parents):
            rows[u, -1] = k - 1 + u
            # the parent's window shifted by one; the root's parent is the last committed row
            rows[u, :-1] = rows[p, 1:] if p >= 0 else np.arange(k - 1)
        return rows


def merge(trees: list[DraftTree]) -> DraftTree:
    """Merge trees with the same root into one, sharing common prefixes (a trie union).

    ``q`` is dropped: once proposals from different drafters share a node, no single draft
    distribution describes its children, so the merged tree is verified as one-hot proposals.
    """
    assert trees and all(t.tokens[0] == trees[0].tokens[0] for t in trees), "roots must agree"
    tokens, parents, source = [trees[0].tokens[0]], [-1], ["root"]
    index: dict[tuple[int, int], int] = {}
    for t_i, t in enumerate(trees):
        where = {0: 0}
        for u in range(1, len(t)):
            key = (where[t.parents[u]], t.tokens[u])
            if key not in index:
                index[key] = len(tokens)
                tokens.append(t.tokens[u])
                parents.append(key[0])
                src = t.source[u] if t.source else f"tree{t_i}"
                source.append(src)
            where[u] = index[key]
    return DraftTree(tokens, parents, None, source)


def attention_mask(tree: DraftTree, key_positions: np.ndarray, root_position: int,
                   window: int | None) -> np.ndarray | None:
    """Boolean mask (N, L + N) for scoring ``tree`` after ``L`` cached keys.

    Cached keys (absolute positions ``key_positions``) are visible to every node; tree nodes
    see only their ancestors and themselves. With a sliding ``window`` a query at position P
    sees keys at positions in ``(P - window, P]``. Returns None when nothing is masked.
    """
    n, n_cached = len(tree), len(key_positions)
    if n == 1 and (window is None or n_cached == 0 or root_position - key_positions[0] < window):
        return None
    q_pos = root_position + tree.depths()
    cached = np.ones((n, n_cached), dtype=bool)
    own = tree.ancestor_mask()
    if window is not None:
        cached &= (q_pos[:, None] - key_positions[None, :]) < window
        own &= (q_pos[:, None] - q_pos[None, :]) < window
    return np.concatenate([cached, own], axis=1)


def chain_mask(n: int, key_positions: np.ndarray, root_position: int,
               window: int | None) -> np.ndarray | None:
    """``attention_mask`` for a chain of ``n`` new tokens (a prefill chunk or a draft chain)."""
    return attention_mask(DraftTree(list(range(n)), list(range(-1, n - 1))),
                          key_positions, root_position, window)


def subtree(tokens: list[int], parents: list[int], keep) -> DraftTree:
    """The tree of the root and the nodes ``keep`` (ids into ``tokens``/``parents``; closed under
    ancestors), in their original order, so parents still precede children."""
    order = [0] + sorted(int(u) for u in keep if u != 0)
    index = {u: i for i, u in enumerate(order)}
    assert all(parents[u] in index for u in order[1:]), "keep must hold every kept node's parent"
    return DraftTree([tokens[u] for u in order], [-1] + [index[parents[u]] for u in order[1:]])
