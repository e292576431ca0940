"""Corpus drafting: prompt lookup, plus what the model itself tends to write next.

Prompt lookup copies continuations from the text at hand, and on open chat it often finds only
a 1- or 2-token match, or none. There the corpus drafter also proposes a chain from the model's
own n-gram table (:mod:`edgespec.heads.corpus`, counted by ``edgespec train corpus`` over answers
the model wrote to questions it was never evaluated on): after the last tokens, the token that
most often followed them, then the same again from the extended text, up to ``max_chain``
tokens, and at each depth the table's runners-up as siblings (up to ``width`` tokens a depth).
These and lookup's branch are merged into one tree (shared prefixes scored once).

Which of them are verified comes from this device's verify-cost curve (``best_budget``, as
EAGLE-3's tree): a node's chance of acceptance is its parent's times its share in the table times
a calibration factor, the running ratio of proposed table tokens the target confirmed to the
shares predicted for them (the shares are counted on the training answers, where they are too
sure; the prior is ``PRIOR_SCALE``, from replaying held-out training answers, not the evaluation
prompts). On a nearly flat curve a long chain and its runners-up are cheap; on a steep one the
tree is cut to its likeliest nodes.

A lookup match of ``SURE_MATCH`` (3) tokens or more is left to lookup alone (it is then right
more often than the table). The table's nodes come on top of lookup's branch: together they stay
within the step's budget, and the curve is read after lookup's nodes. Deterministic proposals:
the tree carries no ``q``, so the verifier treats every branch as a one-hot proposal, lossless
for greedy and sampling alike (as lookup).
"""

from __future__ import annotations

from ..heads.corpus import TOP, NgramTable
from ..targets.cost import CostCurve, best_budget
from ..targets.target import TargetOutput
from ..tree import DraftTree, merge
from ..verify import Accepted
from .lookup import PromptLookupDrafter

PRIOR_SCALE = 0.6  # confirmed / predicted on held-out training answers (scripts/lookup_sim.py)
PRIOR_WEIGHT = 10.0  # the prior counts as this many predicted tokens
DECAY = 0.99  # per tested chain token: the calibration follows the text at hand


class CorpusDrafter(PromptLookupDrafter):
    name = "corpus"

    def __init__(self, table: NgramTable, curve: CostCurve | None, num_draft: int = 8,
                 max_draft: int = 12, max_chain: int = 8, width: int = TOP):
        self.table, self.curve, self.max_chain, self.width = table, curve, max_chain, width
        self.confirmed, self.predicted = PRIOR_SCALE * PRIOR_WEIGHT, PRIOR_WEIGHT
        self.proposed: list[tuple[tuple[int, ...], float]] = []  # (path from the root, share)
        self.branch: list[int] = []  # lookup's deepest branch in the last proposal
        super().__init__(num_draft=num_draft, max_draft=max_draft)
        self.gates_itself = curve is not None

    @property
    def scale(self) -> float:
        """Confirmed / predicted over the proposed table tokens the target got to (decayed,
        from the prior)."""
        return self.confirmed / self.predicted

    def _candidates(self, budget: int) -> list[tuple[float, tuple[int, ...], float]]:
        """(chance of acceptance, path from the root, share) of the chain's tokens and of their
        runners-up (siblings, up to ``width`` per depth), most likely first; a node's chance is
        its parent's times its own calibrated share, so a parent always comes before its
        children."""
        context = self.index.tokens[-self.table.max_context :]
        nodes, path, chance = [], (), 1.0
        while len(path) < min(self.max_chain, budget):
            found = self.table.guesses((context + list(path))[-self.table.max_context :])
            if not found:
                break
            for tok, share in found[1 : self.width]:
                nodes.append((chance * min(1.0, share * self.scale), path + (tok,), share))
            tok, share = found[0]
            chance *= min(1.0, share * self.scale)
            path = path + (tok,)
            nodes.append((chance, path, share))
        nodes.sort(key=lambda n: (-n[0], len(n[1])))
        return nodes[:budget]

    def lookup_tree(self, budget: int) -> DraftTree:
        """Prompt lookup's proposal, which the table's nodes join."""
        return super().propose(budget)

    def propose(self, budget: int) -> DraftTree:
        base = self.lookup_tree(budget)
        self.branch = _deepest(base)
        self.proposed = []
        room = budget - base.num_drafted  # the table's nodes come on top of lookup's
        if room <= 0 or self.confident():  # a long match: lookup alone
            return base
        nodes = self._candidates(room)
        if self.curve is not None and nodes:
            keep = best_budget([c for c, _, _ in nodes], self.curve, in_tree=base.num_drafted)
            nodes = nodes[: keep.nodes]
        if not nodes:
            return base
        self.proposed = [(path, share) for _, path, share in nodes]
        where, tokens, parents = {(): 0}, [self.index.tokens[-1]], [-1]
        for path, _ in self.proposed:
            where[path] = len(tokens)
            tokens.append(path[-1])
            parents.append(where[path[:-1]])
        ours = DraftTree(tokens, parents)
        return ours if base.num_drafted == 0 else merge([base, ours])

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput | None) -> None:
        committed = accepted.tokens
        for path, share in self.proposed:
            d = len(path)
            if len(committed) < d or tuple(committed[: d - 1]) != path[:-1]:
                continue  # untested: the target left this node's path before it
            self.confirmed = DECAY * self.confirmed + (committed[d - 1] == path[-1])
            self.predicted = DECAY * self.predicted + share
        if self.branch:  # lookup's streak counts lookup's own branch, not the table's nodes
            self.observe(full=list(committed[: len(self.branch)]) == self.branch)
        self.proposed, self.branch = [], []
        self.index.extend(committed)


def _deepest(tree: DraftTree) -> list[int]:
    """The tokens of the deepest branch of ``tree`` (empty when it drafts nothing)."""
    if not tree.num_drafted:
        return []
    leaf = max(tree.leaves(), key=lambda u: len(tree.path_to(u)))
    return [tree.tokens[u] for u in tree.path_to(leaf)[1:]]
