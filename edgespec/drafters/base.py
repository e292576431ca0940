"""The Drafter protocol: what every drafting method implements.

A drafter sees the committed token history (through ``prefill`` and ``update``) and proposes a
:class:`DraftTree` rooted at the last committed token. It owns its own state (its KV cache, its
n-gram index); the engine owns the target's cache. ``target_out`` carries the target's logits
and hidden states for drafters that learn from them (EAGLE, Medusa); others ignore it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..config import SamplingConfig
from ..targets.target import TargetOutput
from ..tree import DraftTree
from ..verify import Accepted


@runtime_checkable
class Drafter(Protocol):
    name: str

    def prefill(self, tokens: list[int], target_out: TargetOutput | None,
                sampling: SamplingConfig) -> None:
        """Start a sequence: ``tokens`` is the whole prompt; its last token is the first root.

        ``sampling`` is the request's config: a sampling drafter filters q with it and seeds its
        random stream from it.
        """

    def propose(self, budget: int) -> DraftTree:
        """Propose at most ``budget`` draft tokens (``budget`` may be 0) as a tree."""

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput) -> None:
        """Learn the outcome of verifying ``tree``: ``accepted.tokens`` are now committed."""

    def reset(self) -> None:
        """Forget the sequence (the next call is ``prefill``)."""


class AdaptiveLength:
    """Draft length that grows while whole drafts are accepted and shrinks on rejection."""

    def __init__(self, start: int, maximum: int, adaptive: bool = True):
        self.k, self.maximum, self.adaptive = start, maximum, adaptive

    def observe(self, proposed: int, accepted: int) -> None:
        if not self.adaptive or proposed == 0:
            return
        if accepted == proposed:
            self.k = min(self.k + 1, self.maximum)
        else:
            self.k = max(1, self.k - 1)
