"""A small grammar-like Rule for the tests: banned tokens, and a fixed run forced after a trigger.

``BanAndForce(banned, trigger, run)``: outside a run every token but ``banned`` is allowed; after
``trigger`` the next ``len(run)`` tokens must be ``run`` (one allowed token each: the engine
drafts them for free). It is written from the Rule contract alone (each node's history is the
committed tokens, then the tree's tokens on its path), the way a grammar rule is.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from edgespec.rules import Rule
from edgespec.tree import DraftTree


class BanAndForce(Rule):
    name = "ban-and-force"

    def __init__(self, banned: set[int], trigger: int, run: list[int]):
        self.banned, self.trigger, self.run = set(banned), trigger, list(run)
        self.done: list[int] = []

    def reset(self, prompt: list[int]) -> None:
        self.done = []

    def commit(self, tokens: list[int]) -> None:
        self.done.extend(int(t) for t in tokens)

    def _owed(self, history: list[int]) -> int | None:
        """The token the run forces next after ``history`` (generated tokens), or None."""
        for j in range(len(self.run)):
            tail = history[len(history) - 1 - j :] if len(history) > j else None
            if tail and tail[0] == self.trigger and tail[1:] == self.run[:j]:
                return self.run[j]
        return None

    def allowed(self, history: list[int], vocab: int) -> np.ndarray:
        ok = np.zeros(vocab, dtype=bool)
        owed = self._owed(history)
        if owed is not None:
            ok[owed] = True
            return ok
        ok[:] = True
        ok[list(self.banned)] = False
        return ok

    def _history(self, tree: DraftTree, u: int) -> list[int]:
        return self.done + [int(tree.tokens[i]) for i in tree.path_to(u)[1:]]

    def apply(self, tree: DraftTree, logits: mx.array) -> mx.array:
        vocab = logits.shape[-1]
        ok = np.stack([self.allowed(self._history(tree, u), vocab) for u in range(len(tree))])
        return mx.where(mx.array(ok), logits, -mx.inf)

    def allows(self, tree: DraftTree) -> np.ndarray:
        out = np.ones(len(tree), dtype=bool)
        for u in range(1, len(tree)):
            hist = self._history(tree, tree.parents[u])
            t = int(tree.tokens[u])
            owed = self._owed(hist)
            out[u] = t == owed if owed is not None else t not in self.banned
        return out

    def forced(self, prefix: list[int], limit: int) -> list[int]:
        hist, out = self.done + list(prefix), []
        while len(out) < limit and (owed := self._owed(hist)) is not None:
            out.append(owed)
            hist.append(owed)
        return out

