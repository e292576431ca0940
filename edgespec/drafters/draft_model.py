"""Classic speculative decoding: a smaller model that shares the target's vocabulary drafts a chain.

The draft model keeps its own KV cache in step with the committed history: after each
verification the rejected drafts are trimmed away (O(1)) and the tokens it has not seen yet
(the bonus token, and the last draft when all were accepted) are fed at the next proposal.
With sampling, drafts are drawn from the draft's distribution filtered by the same
SamplingConfig as the target's, and that distribution is attached as ``q`` for the verifier.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..config import SamplingConfig
from ..errors import CacheRollbackError, DraftMismatchError
from ..prompt import shared_prefix
from ..targets.target import Target, TargetOutput
from ..sampling import draw, make_rng, probs
from ..tree import DraftTree
from ..verify import Accepted
from .base import AdaptiveLength, Drafter

_PREFILL_CHUNK = 512


def check_vocabularies(target: Target, draft: Target) -> None:
    """Raise DraftMismatchError unless both tokenizers map the same strings to the same ids."""
    tv, dv = target.tokenizer.vocab(), draft.tokenizer.vocab()
    if tv == dv:
        return
    differ = sorted(t for t in set(tv) ^ set(dv) | {t for t in set(tv) & set(dv) if tv[t] != dv[t]})
    raise DraftMismatchError(
        f"draft model {draft.name} has a different vocabulary from target {target.name} "
        f"({len(dv)} vs {len(tv)} tokens; e.g. {differ[:3]!r} differ); a draft model must "
        "share the target's tokenizer")


class DraftModelDrafter(Drafter):
    name = "draft"

    def __init__(self, draft: Target, sampling: SamplingConfig, num_draft: int = 4,
                 max_draft: int = 12, adaptive: bool = True, vocab_size: int | None = None):
        self.draft = draft
        self.sampling = sampling
        self.length = AdaptiveLength(num_draft, max_draft, adaptive)
        self.vocab_size = vocab_size  # the target's logits width, for q
        self.rng = make_rng(sampling, stream=1)
        self.reset()

    def reset(self) -> None:
        self.history: list[int] = []
        self.prompt_end = -1  # where the draft's cache ends once it has read the prompt
        self.cache = self._new_cache()

    def _new_cache(self):
        return self.draft.make_cache()

    def prefill(self, tokens: list[int], target_out: TargetOutput | None,
                sampling: SamplingConfig | None = None) -> None:
        # Keep the draft's KV for the prefix this prompt shares with the last sequence (a chat
        # resends its history each turn); rebuild from scratch when nothing is shared.
        common = self.cache.reachable(shared_prefix(self.history[: self.cache.offset],
                                                    tokens[:-1]))
        try:
            self.cache.trim(self.cache.offset - common)
        except CacheRollbackError:  # a sliding window dropped what the shared prefix needs
            common = 0
        if not common:
            self.reset()
        self._start(tokens, sampling)

    def _start(self, tokens: list[int], sampling: SamplingConfig | None) -> None:
        """Take ``tokens`` as the history and (re)seed the draft's random stream."""
        self.history = list(tokens)
        self.prompt_end = len(tokens)
        if sampling is not None:
            self.sampling = sampling
        self.rng = make_rng(self.sampling, stream=1)

    def _feed(self, tokens: list[int]) -> mx.array:
        """Run the draft over tokens it has not seen; commit them; return the last logits."""
        for a in range(0, len(tokens), _PREFILL_CHUNK):
            chunk = tokens[a : a + _PREFILL_CHUNK]
            out = self.draft.score(chunk, self.cache)
            self.cache.commit()
        return out.logits[-1]

    def _choose(self, logits: mx.array, i: int = 0) -> tuple[int, np.ndarray | None]:
        """The ``i``-th draft of a proposal from ``logits`` (and q, when sampling)."""
        if self.sampling.greedy:
            return int(mx.argmax(logits).item()), None
        q = probs(np.array(logits.astype(mx.float32)), self.sampling)
        if self.vocab_size and len(q) < self.vocab_size:
            q = np.pad(q, (0, self.vocab_size - len(q)))
        # the draft's output position: the tokens generated since the prompt, then i more
        return draw(q, self.sampling, self.rng, len(self.history) - self.prompt_end + i), q

    def _longest(self) -> int:
        """Most drafts a proposal may hold (subclasses that stop early may allow more)."""
        return self.length.k

    def _stop_after(self, logits: mx.array) -> bool:
        """Whether to end the chain after the draft just chosen from ``logits``."""
        return False

    def propose(self, budget: int) -> DraftTree:
        k = min(self._longest(), budget)
        root = self.history[-1]
        if k <= 0:
            return DraftTree.chain(root, [])
        logits = self._feed(self.history[self.cache.offset :])
        if self.cache.offset == self.prompt_end:  # a next prompt sharing this one resumes here
            self.cache.pin()
        self.cache.hold()  # the drafts are fed one by one; update trims back over them
        drafts, qs = [], []
        for i in range(k):
            tok, q = self._choose(logits, i)
            drafts.append(tok)
            qs.append(q)
            # the last draft is never fed: the cache holds the history plus drafts[:-1]
            if i == k - 1 or self._stop_after(logits):
                break
            logits = self._feed([tok])
        q_rows = None if self.sampling.greedy else np.stack(qs + [np.zeros_like(qs[0])])
        return DraftTree.chain(root, drafts, q_rows)

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput) -> None:
        k, m = tree.num_drafted, accepted.num_accepted
        if k > 0:
            # the cache holds the history plus drafts[:k-1]; keep the accepted ones
            try:
                self.cache.trim((k - 1) - min(m, k - 1))
            except CacheRollbackError:  # a hybrid draft committed several drafts at once (the
                self.cache = self._new_cache()  # cascade): no state there; re-read the history
        self.history.extend(accepted.tokens)
        self.length.observe(k, m)

