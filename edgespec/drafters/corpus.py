"""Corpus drafting: prompt lookup, plus what the model itself tends to write next.

Prompt lookup copies continuations from the text at hand, and on open chat it often finds only
a 1- or 2-token match, or none. There the corpus drafter also proposes a chain from the model's
own n-gram table (:mod:`edgespec.heads.corpus`, counted by ``edgespec train corpus`` over answers
the model wrote to questions it was never evaluated on): after the last tokens, the token that
most often followed them, then the same again from the extended text, up to ``max_chain``
tokens. The chain and lookup's branch are merged into one tree (shared prefixes scored once).

How long the chain is comes from this device's verify-cost curve (``best_budget``, as EAGLE-3's
tree): node i's chance of acceptance is estimated as the product of the table's shares along the
chain times a calibration factor, the running ratio of the chain's tokens the target confirmed
to the shares predicted for them (the shares are counted on the training answers, where they
are too sure; the prior is ``PRIOR_SCALE``, from replaying held-out training answers, not the
evaluation prompts). On a nearly flat curve a long chain is cheap; on a steep one it is cut short.

A lookup match longer than ``LOOKUP_ONLY`` tokens is left to lookup alone (it is then right
more often than the table). Deterministic proposals: the tree carries no ``q``, so the verifier
treats every branch as a one-hot proposal, lossless for greedy and sampling alike (as lookup).
"""

from __future__ import annotations

from ..heads.corpus import NgramTable
from ..targets.cost import CostCurve, best_budget
from ..targets.target import TargetOutput
from ..tree import DraftTree, merge
from ..verify import Accepted
from .lookup import PromptLookupDrafter

PRIOR_SCALE = 0.6  # confirmed / predicted on held-out training answers (scripts/lookup_sim.py)
PRIOR_WEIGHT = 10.0  # the prior counts as this many predicted tokens
DECAY = 0.99  # per tested chain token: the calibration follows the text at hand
LOOKUP_ONLY = 2


class CorpusDrafter(PromptLookupDrafter):
    name = "corpus"

    def __init__(self, table: NgramTable, curve: CostCurve | None, num_draft: int = 8,
                 max_draft: int = 12, max_chain: int = 8):
        self.table, self.curve, self.max_chain = table, curve, max_chain
        self.confirmed, self.predicted = PRIOR_SCALE * PRIOR_WEIGHT, PRIOR_WEIGHT
        self.chain: tuple[list[int], list[float]] = ([], [])
        super().__init__(num_draft=num_draft, max_draft=max_draft)

    @property
    def scale(self) -> float:
        """Confirmed / predicted over the chains' tested tokens (decayed, from the prior)."""
        return self.confirmed / self.predicted

    def propose(self, budget: int) -> DraftTree:
        base = super().propose(budget)
        self.chain = ([], [])
        match, _ = self.index.continuations(1)
        if budget <= 0 or match > LOOKUP_ONLY:
            return base
        history, tokens, shares = list(self.index.tokens), [], []
        while len(tokens) < min(self.max_chain, budget):
            guess = self.table.guess(history)
            if guess is None:
                break
            tokens.append(guess[0])
            shares.append(guess[1])
            history.append(guess[0])
        if self.curve is not None and tokens:
            path, p = [], 1.0
            for s in shares:
                p *= min(1.0, s * self.scale)
                path.append(p)
            keep = best_budget(path, self.curve).nodes
            tokens, shares = tokens[:keep], shares[:keep]
        if not tokens:
            return base
        self.chain = (tokens, shares)
        ours = DraftTree.chain(self.index.tokens[-1], tokens)
        return ours if base.num_drafted == 0 else merge([base, ours])

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput | None) -> None:
        tokens, shares = self.chain
        committed = accepted.tokens
        for i, (tok, share) in enumerate(zip(tokens, shares)):
            if i >= len(committed) or committed[:i] != tokens[:i]:
                break  # untested: the target left the chain before this token
            self.confirmed = DECAY * self.confirmed + (committed[i] == tok)
            self.predicted = DECAY * self.predicted + share
        self.chain = ([], [])
        super().update(accepted, tree, target_out)
