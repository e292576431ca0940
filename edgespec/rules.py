"""Rules: per-node transforms of the target's next-token logits (grammars, penalties, forced tokens).

Contract. A :class:`Rule` sees the tokens a request has generated so far (``commit``) and, for a
draft tree, transforms each node's logits row from *that node's own history*: the committed
tokens followed by the tree's tokens on the path from the root to the node (the root itself is
the last committed token and is already committed). The verifier accepts against the
transformed rows, so with any drafter

- greedy output equals plain decoding under the same rules, token for token;
- sampled output follows the transformed distribution (the same rejection rules, on rows that
  every node computed from its own history).

A rule also tells the engine what it forbids and what it forces, so that drafting can skip the
forbidden tokens (``allows``: a node whose token the rule forbids after its parent is cut before
verification) and propose the forced ones for free (``forced``: the run of tokens that are the
only ones allowed).

Rules compose (:class:`Rules`): each transforms the previous one's output, in order; a node is
allowed when every rule allows it; the forced run is the one every rule agrees on.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .tree import DraftTree


class Rule:
    """One transform of the target's logits. Subclasses override what they change; the base
    class is the identity (allows everything, forces nothing, never finished)."""

    name: str = "rule"

    def reset(self, prompt: list[int]) -> None:
        """Start a sequence after ``prompt`` (token ids; nothing generated yet)."""

    def commit(self, tokens: list[int]) -> None:
        """``tokens`` were generated and committed, in order (each step's accepted tokens and
        the bonus)."""

    def apply(self, tree: DraftTree, logits: mx.array) -> mx.array:
        """Row ``u`` of ``logits`` (N, V) transformed for node ``u``'s history (committed tokens,
        then ``tree.tokens[i]`` for ``i`` in ``tree.path_to(u)[1:]``). A token the rule forbids
        there gets -inf: the engine reads a node's allowed set from it (to condition sampled
        drafts' q on it, ``rule_tree.masked_q``)."""
        return logits

    def allows(self, tree: DraftTree) -> np.ndarray:
        """(N,) bool: whether node ``u``'s token is allowed after its parent's history (the root
        is always allowed)."""
        return np.ones(len(tree), dtype=bool)

    def forced(self, prefix: list[int], limit: int) -> list[int]:
        """Up to ``limit`` tokens forced after the committed tokens and ``prefix``: each the only
        token the rule allows at that point."""
        return []

    def finished(self) -> bool:
        """Whether the committed tokens are complete for this rule (generation must stop)."""
        return False


class Rules(Rule):
    """Several rules applied in order (the identity when empty)."""

    name = "rules"

    def __init__(self, rules: list[Rule]):
        self.rules = list(rules)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def reset(self, prompt: list[int]) -> None:
        for r in self.rules:
            r.reset(prompt)

    def commit(self, tokens: list[int]) -> None:
        for r in self.rules:
            r.commit(tokens)

    def apply(self, tree: DraftTree, logits: mx.array) -> mx.array:
        for r in self.rules:
            logits = r.apply(tree, logits)
        return logits

    def allows(self, tree: DraftTree) -> np.ndarray:
        ok = np.ones(len(tree), dtype=bool)
        for r in self.rules:
            ok &= r.allows(tree)
        return ok

    def forced(self, prefix: list[int], limit: int) -> list[int]:
        runs = [r.forced(prefix, limit) for r in self.rules]
        runs = [run for run in runs if run] or [[]]
        first = runs[0]
        n = next((i for i in range(len(first)) if any(len(r) <= i or r[i] != first[i]
                                                      for r in runs[1:])), len(first))
        return first[:n]

    def finished(self) -> bool:
        return any(r.finished() for r in self.rules)
