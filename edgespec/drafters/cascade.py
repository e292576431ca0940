"""Cascade (staged speculative decoding): a cheap drafter drafts for the draft model.

``CascadeDrafter.propose`` builds its k-token chain by running speculative decoding *of the
draft model*: the inner drafter (prompt lookup by default) proposes a tree, the draft model
scores it in one forward (``Target.score``), and ``verify.accept`` keeps the part the draft
model agrees with plus one token of the draft model's own. Repeat until the chain has k tokens.
Each boundary is exact:

- greedy: ``verify_greedy`` makes the chain the draft model's greedy chain, and the outer
  ``verify_greedy`` is lossless for any proposal;
- sampling: ``verify_sampling`` with p = the draft model's filtered distribution makes each chain
  token distributed exactly as q (the draft model's filtered distribution after its prefix), and
  those q rows are attached to the chain, so the outer ``verify_sampling`` stays lossless.

The draft model's KV cache holds "history + chain minus its last token", as for
:class:`DraftModelDrafter`, whose prefill (prefix reuse) and update (trim rejected drafts) it
inherits: after each inner forward only the accepted tree path is committed (one gather).
The inner drafter sees the draft-level sequence (history + chain so far); after the outer
verification rejects drafts it is rewound to the committed history (its ``rewind`` ability:
O(rewound tokens) for prompt lookup; a fresh ``prefill`` for inner drafters without it).

Cost: one draft forward per inner step instead of one per draft token; the inner tree's nodes
are extra rows in that forward. It pays when the inner drafter is right often (repetitive text,
code edits) and the draft model is much cheaper than the target.
"""

from __future__ import annotations

import numpy as np

from ..config import SamplingConfig
from ..prompt import shared_prefix
from ..targets.target import Target
from ..tree import DraftTree
from ..verify import Accepted, accept
from .base import Drafter
from .draft_model import DraftModelDrafter
from .lookup import PromptLookupDrafter


class CascadeDrafter(DraftModelDrafter):
    name = "cascade"

    def __init__(self, draft: Target, sampling: SamplingConfig, num_draft: int = 4,
                 max_draft: int = 12, adaptive: bool = True, inner: Drafter | None = None,
                 vocab_size: int | None = None):
        self.inner = inner or PromptLookupDrafter(num_draft=num_draft, max_draft=max_draft)
        self.seen: list[int] = []  # the sequence the inner drafter has been shown
        super().__init__(draft, sampling, num_draft, max_draft, adaptive, vocab_size)

    def reset(self) -> None:
        super().reset()
        self.inner.reset()
        self.seen = []

    def prefill(self, tokens: list[int], target_out, sampling: SamplingConfig | None = None) -> None:
        super().prefill(tokens, target_out, sampling)
        self.inner.prefill(list(tokens), None, self.sampling)
        self.seen = list(tokens)

    def propose(self, budget: int) -> DraftTree:
        k = min(self.length.k, budget)
        root = self.history[-1]
        if k <= 0:
            return DraftTree.chain(root, [])
        seq = list(self.history)
        self._show_inner(seq)
        self.cache.hold()  # update trims back to the end of an inner step
        drafts: list[int] = []
        rows: list[np.ndarray] = []
        while len(drafts) < k:
            tokens, q = self._inner_step(seq, k - len(drafts))
            drafts += tokens
            rows += q
            seq += tokens
        q_rows = None if self.sampling.greedy else np.stack(rows + [np.zeros_like(rows[0])])
        return DraftTree.chain(root, drafts, q_rows)

    def _inner_step(self, seq: list[int], r: int) -> tuple[list[int], list[np.ndarray]]:
        """One speculative step of the draft model: at most ``r`` tokens of its chain (and q rows).

        Precondition: the cache holds ``seq[:cache.offset]``; the rest of ``seq`` is unseen.
        Postcondition: the cache holds the extended ``seq`` minus its new last token.
        """
        cache = self.cache
        if len(seq) - cache.offset > 2:  # the prompt: fed in chunks (usually 1-2 tokens are new)
            self._feed(seq[cache.offset : -1])
        unseen = seq[cache.offset :]
        inner = self.inner.propose(r - 1)  # accepted + bonus <= r tokens
        assert inner.tokens[0] == seq[-1] and max(inner.depths()) <= r - 1
        lead = len(unseen) - 1  # unseen tokens before the root, scored as a chain in front
        tree = DraftTree(unseen[:-1] + inner.tokens,
                         list(range(-1, lead - 1)) + [p + lead if p >= 0 else lead - 1 for p in inner.parents])
        logits = self.draft.score(tree, cache).logits[lead:]
        # seeded: the draft model's tokens drawn at the outer verifier's keyed uniforms, so
        # they are its tokens whenever the two models agree there (``sampling.draw``)
        acc, p = accept(inner, logits, self.sampling, self.rng, self.vocab_size,
                        at=len(seq) - self.prompt_end)
        # token j of acc.tokens was drawn (exactly, by the lossless rule) from p[path[j]]
        q = [] if p is None else [p[u] for u in acc.path]
        cache.commit(list(range(lead)) + [u + lead for u in acc.path])
        self.inner.update(acc, inner, None)
        self.seen = seq + acc.tokens
        return acc.tokens, q

    def _show_inner(self, seq: list[int]) -> None:
        """Bring the inner drafter from ``self.seen`` to ``seq`` (the committed history)."""
        seen = self.seen
        common = shared_prefix(seen, seq)
        if common < len(seen) and not self.inner.rewind(len(seen) - common):
            self.inner.prefill(list(seq), None, self.sampling)
            self.seen = list(seq)
            return
        if len(seq) > common:
            tail = seq[common:]
            # a zero-draft step committing `tail`: how the protocol tells a drafter of new tokens
            self.inner.update(Accepted([0], tail), DraftTree.chain(seq[common - 1], []), None)
        self.seen = list(seq)

