"""Lookahead decoding (Fu et al. 2024): Jacobi trajectories feed an n-gram pool; no draft model.

Three sizes: the window ``W`` (Jacobi positions guessed ahead), the n-gram size ``N`` (the
window keeps ``N - 1`` levels of its trajectory) and the guess-set size ``G`` (candidate
n-grams verified per step). Each step the target scores, in ONE forward over one tree:

- the **verification branch**: up to ``G`` n-grams from the pool whose first token is the root,
  their remaining ``N - 1`` tokens merged as a trie under the root;
- the **lookahead branch**: the 2D window. Level 0 is a causal chain of ``W`` tokens from the
  root; level ``l`` of column ``i`` hangs below level ``l - 1`` of column ``i``. So a window
  token at (level ``l``, column ``i``) sits at depth ``1 + i + l`` and attends to the history,
  level 0 up to column ``i`` and its own column above it. That is the lookahead attention
  pattern (column ``i`` is one sequence: level 0 up to ``i``, then its own column, at positions
  ``root + 1 + i + l``), and it is an ancestors-only tree mask, so no engine hook is needed.

After verification, the target's argmax after each last-level token is the next trajectory
level (a Jacobi step); once the window holds ``N - 1`` levels, each column plus its new token is
an ``N``-gram for the pool and the oldest level is dropped. With ``from_history`` the n-grams of
the committed text go into the pool too (an addition to the paper: free, and it helps on
repetitive text).

Lossless: every tree node is a deterministic proposal verified like any other (no ``q``), so
greedy output is exact and sampling uses the verifier's one-hot rule. A window token is a
proposal too; it is rarely accepted, and exact when it is. The engine commits only the accepted
path, so window tokens never reach the KV cache.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..config import SamplingConfig
from ..errors import ConfigError
from ..targets.target import TargetOutput
from ..tree import DraftTree, merge
from ..verify import Accepted
from .base import Drafter


class NgramPool:
    """Candidate continuations keyed by their first token: most recent first, ``g`` per key."""

    def __init__(self, g: int):
        self.g = g
        self.grams: dict[int, list[tuple[int, ...]]] = {}

    def add(self, gram: tuple[int, ...]) -> None:
        tails = self.grams.setdefault(gram[0], [])
        tail = tuple(gram[1:])
        if tail in tails:
            tails.remove(tail)
        tails.insert(0, tail)
        del tails[self.g :]

    def get(self, token: int) -> list[tuple[int, ...]]:
        return self.grams.get(token, [])

    def __len__(self) -> int:
        return sum(len(t) for t in self.grams.values())


class JacobiWindow:
    """The 2D lookahead window: ``levels[l][i]`` is level ``l`` of column ``i`` (1..n-1 levels)."""

    def __init__(self, first_level: list[int], n: int):
        self.w, self.n = len(first_level), n
        self.levels = [list(first_level)]

    @property
    def depth(self) -> int:
        """Deepest window node below the root."""
        return self.w + len(self.levels) - 1

    @property
    def size(self) -> int:
        return self.w * len(self.levels)

    def attach(self, tree: DraftTree) -> tuple[DraftTree, np.ndarray]:
        """``tree`` with the window appended under its root; also the (levels, W) node indices."""
        tokens, parents = list(tree.tokens), list(tree.parents)
        source = list(tree.source) if tree.source else ["root"] + ["pool"] * tree.num_drafted
        idx = np.zeros((len(self.levels), self.w), dtype=np.int64)
        for l, level in enumerate(self.levels):
            for i, t in enumerate(level):
                if l == 0:  # level 0: a causal chain from the root
                    parent = int(idx[0, i - 1]) if i else 0
                else:  # deeper levels continue their column
                    parent = int(idx[l - 1, i])
                idx[l, i] = len(tokens)
                tokens.append(t)
                parents.append(parent)
        return DraftTree(tokens, parents, None, source + ["lookahead"] * self.size), idx

    def advance(self, new_level: list[int]) -> list[tuple[int, ...]]:
        """One Jacobi step: append ``new_level``; once full, return the columns' n-grams and
        drop the oldest level."""
        assert len(new_level) == self.w
        if len(self.levels) < self.n - 1:
            self.levels.append(list(new_level))
            return []
        grams = [(*col, t) for col, t in zip(zip(*self.levels), new_level)]
        self.levels = self.levels[1:] + [list(new_level)]
        return grams


class LookaheadDrafter(Drafter):
    name = "lookahead"

    def __init__(self, window: int = 4, ngram: int = 4, guesses: int = 4, max_nodes: int = 32,
                 from_history: bool = True, seed: int = 0):
        for label, v, lo in (("window", window, 1), ("ngram", ngram, 2), ("guesses", guesses, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ConfigError(f"lookahead {label} must be an integer >= {lo}, got {v!r}")
        nodes = 1 + (window + guesses) * (ngram - 1)
        if nodes > max_nodes:
            raise ConfigError(f"lookahead tree of 1 + (window {window} + guesses {guesses}) x "
                              f"(ngram {ngram} - 1) = {nodes} nodes exceeds max_nodes={max_nodes}; "
                              f"lower window, guesses or ngram")
        self.w, self.n, self.g, self.max_nodes = window, ngram, guesses, max_nodes
        self.from_history, self.seed = from_history, seed
        self.reset()

    def reset(self) -> None:
        self.history: list[int] = []
        self.pool = NgramPool(self.g)
        self.window: JacobiWindow | None = None
        self._window_nodes: np.ndarray | None = None  # (levels, W) node ids in the last tree

    def prefill(self, tokens: list[int], target_out: TargetOutput | None,
                sampling: SamplingConfig | None = None) -> None:
        self.reset()
        # The paper starts the trajectory from random prompt tokens; seeded, so runs repeat.
        rng = np.random.default_rng(self.seed)
        self.window = JacobiWindow([int(t) for t in rng.choice(tokens, self.w)], self.n)
        self._commit(tokens)

    def _commit(self, tokens: list[int]) -> None:
        for t in tokens:
            self.history.append(t)
            if self.from_history and len(self.history) >= self.n:
                self.pool.add(tuple(self.history[-self.n :]))

    def propose(self, budget: int) -> DraftTree:
        """Verification branches (depth <= min(N - 1, budget)) plus the window when it fits."""
        root = self.history[-1]
        self._window_nodes = None
        k = min(self.n - 1, budget)
        branches = [DraftTree([root, *g[:k]], list(range(-1, k)), None, ["root"] + ["pool"] * k)
                    for g in self.pool.get(root)] if k else []
        tree = merge(branches) if branches else DraftTree.chain(root, [])
        if self.window is not None and self.window.depth <= budget:
            tree, self._window_nodes = self.window.attach(tree)
        assert len(tree) <= self.max_nodes
        return tree

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput) -> None:
        self._commit(accepted.tokens)
        if self._window_nodes is None:
            return
        last = mx.array(self._window_nodes[-1])
        new_level = np.array(mx.argmax(target_out.logits[last], axis=-1)).tolist()
        for gram in self.window.advance(new_level):
            self.pool.add(gram)
        self._window_nodes = None
