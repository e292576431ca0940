"""Prompt lookup: draft by copying what followed earlier occurrences of the recent context.

An incrementally updated hashed n-gram index maps every n-gram of the history (for n in
``[min_ngram, max_ngram]``) to the positions right after its occurrences, so a lookup costs
O(max_ngram) dictionary probes however long the context is — no rescan per step. At each step
the longest suffix of the history that occurred before is looked up; its most recent distinct
continuations (up to ``max_branches``; 1 by default on measurement, see ``_REACH``) become the
branches of a draft tree (merged as a trie, so shared prefixes are scored once). How far each branch reaches adapts to the evidence: a longer match and a run of
accepted drafts allow longer branches; rejections shorten them.

Deterministic proposals: the tree carries no ``q`` and the verifier treats each branch as a
one-hot proposal, which is lossless for greedy and sampling alike.
"""

from __future__ import annotations

from collections import defaultdict

from ..config import SamplingConfig
from ..targets.target import TargetOutput
from ..tree import DraftTree, merge
from ..verify import Accepted
from .base import Drafter


class NgramIndex:
    """Positions following each n-gram of a growing token sequence (n in [lo, hi])."""

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi
        self.tokens: list[int] = []
        self.follow: dict[tuple[int, ...], list[int]] = defaultdict(list)

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            self.tokens.append(t)
            end = len(self.tokens)
            # the n-gram ending at the previous token is followed by position end - 1
            for n in range(self.lo, self.hi + 1):
                if end - 1 >= n:
                    self.follow[tuple(self.tokens[end - 1 - n : end - 1])].append(end - 1)

    def rewind(self, n: int) -> None:
        """Undo the last ``n`` tokens of ``extend`` (each added one position per n-gram size)."""
        for _ in range(n):
            end = len(self.tokens)
            for size in range(self.lo, self.hi + 1):
                if end - 1 >= size:
                    follow = self.follow[tuple(self.tokens[end - 1 - size : end - 1])]
                    assert follow and follow[-1] == end - 1
                    follow.pop()
            self.tokens.pop()

    def continuations(self, max_branches: int) -> tuple[int, list[int]]:
        """(longest match length, start positions of distinct continuations).

        Continuations of the longest matching suffix come first (most recent first); shorter
        matches fill the remaining branches with continuations that start differently.
        """
        toks, picked, firsts, longest = self.tokens, [], set(), 0
        for n in range(min(self.hi, len(toks)), self.lo - 1, -1):
            for s in reversed(self.follow.get(tuple(toks[len(toks) - n :]), ())):
                if toks[s] in firsts:
                    continue
                longest = longest or n
                firsts.add(toks[s])
                picked.append(s)
                if len(picked) == max_branches:
                    return longest, picked
        return longest, picked


class PromptLookupDrafter(Drafter):
    name = "lookup"

    def __init__(self, num_draft: int = 8, max_draft: int = 12, max_branches: int = 1,
                 max_nodes: int = 16, min_ngram: int = 1, max_ngram: int = 4):
        self.base, self.max_draft = num_draft, max_draft
        self.max_branches, self.max_nodes = max_branches, max_nodes
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.reset()

    def reset(self) -> None:
        self.index = NgramIndex(self.min_ngram, self.max_ngram)
        self.streak = 0  # consecutive steps whose whole best branch was accepted

    def prefill(self, tokens: list[int], target_out: TargetOutput | None,
                sampling: SamplingConfig | None = None) -> None:
        self.reset()
        self.index.extend(tokens)

    # Branch length by match length: a 1-token match is weak evidence (on open chat most such
    # drafts are rejected), a 3-gram is strong. Replayed on training answers against the
    # current cost curve (scripts/lookup_sim.py), these reaches come within a few percent of the
    # best of a grid of reaches and branch counts, so they are kept (see docs/measurements.md,
    # "lookup's constants"). Trees (max_branches > 1) are tested for exactness.
    _REACH = (0, 1, 2, 5, 8)

    def _length(self, match: int, budget: int) -> int:
        """Branch length from the evidence: match length and the recent acceptance streak."""
        k = self._REACH[min(match, len(self._REACH) - 1)] + 2 * self.streak
        return max(1, min(k, max(self.base, 1) * 2, self.max_draft, budget))

    # A match this long pays on its own (see ``AutoDrafter``): auto then drafts without asking
    # its bandit. Chosen by replaying the demo model's training answers against its cost curve:
    # per step, 3-token and longer matches were estimated well ahead of plain decoding, 1- and
    # 2-token ones close to it (see docs/measurements.md, "lookup's constants").
    SURE_MATCH = 3

    def confident(self) -> bool:
        """Whether the next proposal rests on a match of at least ``SURE_MATCH`` tokens."""
        match, starts = self.index.continuations(1)
        return bool(starts) and match >= self.SURE_MATCH

    def rewind(self, n: int) -> bool:
        self.index.rewind(n)
        return True

    def propose(self, budget: int) -> DraftTree:
        toks = self.index.tokens
        root = toks[-1]
        if budget <= 0:
            return DraftTree.chain(root, [])
        match, starts = self.index.continuations(self.max_branches)
        if not starts:
            return DraftTree.chain(root, [])
        k = self._length(match, budget)
        chains, nodes = [], 0
        for s in starts:
            branch = toks[s : s + k]
            if nodes + len(branch) > self.max_nodes:
                branch = branch[: self.max_nodes - nodes]
            if branch:
                chains.append(DraftTree.chain(root, branch))
                nodes += len(branch)
            k = max(1, k // 2)  # older alternatives get shorter branches
        return merge(chains) if len(chains) > 1 else chains[0]

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput) -> None:
        if tree.num_drafted:
            deepest = max(len(tree.path_to(leaf)) - 1 for leaf in tree.leaves())
            self.observe(full=accepted.num_accepted >= deepest)
        self.index.extend(accepted.tokens)

    def observe(self, full: bool) -> None:
        """Count a step that proposed a branch: its whole best branch was accepted, or not."""
        self.streak = min(self.streak + 1, 4) if full else max(0, self.streak - 1)
