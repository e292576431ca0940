"""The Drafter base class: what every drafting method implements, and the abilities it may declare.

A drafter sees the committed token history (through ``prefill`` and ``update``) and proposes a
:class:`DraftTree` rooted at the last committed token. It owns its own state (its KV cache, its
n-gram index); the engine owns the target's cache. ``target_out`` carries the target's logits
and hidden states for drafters that learn from them (EAGLE, Medusa); others ignore it.

Optional abilities are members of this class with a neutral default; a method declares one by
overriding it, and the code that uses an ability (the engine, ``auto``, ``cascade``) calls the
member directly:

- ``confident()``: the next proposal is sure to pay (``auto`` gives such a step to this arm
  outside its bandit; a pure query: ``auto`` also asks it in ``plain_next``);
- ``lower_layers`` > 0: the drafter runs the target's own first ``lower_layers`` layers; the
  engine then hands it a :class:`~edgespec.targets.lower_layers.LowerLayers` through
  ``use_lower_layers`` and verifies only the layers above;
- ``rewind(n)``: forget the last ``n`` tokens it was shown, cheaply (``cascade`` rewinds its
  inner drafter after a rejection; a drafter that cannot says so and is prefilled again);
- ``target_features``: layers whose INPUT hidden states the drafter learns from (EAGLE-3's aux
  layers). When non-empty the engine captures them (``Target.score(..., capture=)``) in every
  prefill chunk and every verification, and ``target_out.captured[layer]`` holds one row per
  scored token: in ``prefill``, the prompt positions the engine actually scored (with prefix
  reuse the first ones are not re-scored: the rows are the LAST ones of the prompt but its final
  token), in ``update``, one per tree node;
- ``prediction_tokens()``: counts of a predicted output's drafted tokens kept and rejected
  (the engine copies them into ``Stats`` after every step);
- ``plain_next()``: asked after the drafter proposed an empty tree and before that step's
  ``update``: its next proposal will be empty too, unless what it learns from this step's token
  changes that. The engine then launches the next step's forward (plain decoding, pipelined:
  ``plain_pipeline.py``) before reading this step's token, and starts that step with
  ``propose(0)`` after the ``update``; every step still goes through ``propose`` and ``update``
  with the target's output of the step, as in the step loop. Only under greedy decoding without
  rules, and not for a drafter with ``lower_layers``;
- ``gates_itself``: the drafter decides on the verify-cost curve how much of each proposal is
  worth scoring, and proposing costs it no forward of its own (the corpus drafter: a table
  lookup). A bandit's plain arm beside such arms only adds noise, so ``auto`` keeps none when
  all its drafting arms gate themselves (``registry._auto``);
- ``wants_hidden``: the drafter reads ``target_out.hidden`` (the last layer's output, before the
  final norm; Medusa). Verification always carries it; with this set, ``prefill`` gets it too;
- ``share_heads(on)`` / ``head_feeds()``: beside other decodings (``batch.Batch`` says so before
  each step), a drafter with a trained head (EAGLE-3) leaves the head's forward over a step's
  accepted tokens undone in ``update`` and lists itself in ``head_feeds()``; the batch then runs
  the due feeds of all its decodings as one forward (``eagle3.feed_many``). One it does not run
  is run by the drafter's next ``propose``, as alone.

A drafter that declares neither gets ``target_out=None`` in ``prefill`` and costs the engine
nothing extra.
"""

from __future__ import annotations

from ..config import SamplingConfig
from ..targets.lower_layers import LowerLayers
from ..targets.target import TargetOutput
from ..tree import DraftTree
from ..verify import Accepted


class Drafter:
    name: str = ""
    lower_layers: int = 0  # ability: drafts through this many of the target's own first layers
    target_features: tuple[int, ...] = ()  # ability: the layers whose input hidden states it reads
    wants_hidden: bool = False  # ability: reads the target's last hidden state in prefill too
    gates_itself: bool = False  # ability: sizes its proposals on the cost curve, at no forward's cost

    def prefill(self, tokens: list[int], target_out: TargetOutput | None,
                sampling: SamplingConfig) -> None:
        """Start a sequence: ``tokens`` is the whole prompt; its last token is the first root.

        ``target_out`` is None unless the drafter declares ``target_features`` or
        ``wants_hidden``; then it holds the rows of the prompt positions the engine scored
        (``len(tokens) - 1 - rows`` of them came from the reused cache and have none).

        ``sampling`` is the request's config: a sampling drafter filters q with it and seeds its
        random stream from it.
        """
        raise NotImplementedError

    def propose(self, budget: int) -> DraftTree:
        """Propose at most ``budget`` draft tokens (``budget`` may be 0) as a tree."""
        raise NotImplementedError

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput | None) -> None:
        """Learn the outcome of verifying ``tree``: ``accepted.tokens`` are now committed."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the sequence (the next call is ``prefill``)."""
        raise NotImplementedError

    # ---- abilities (override to declare) ----

    def confident(self) -> bool:
        """Whether the next proposal is sure to pay (``auto`` takes it outside its bandit)."""
        return False

    def plain_next(self) -> bool:
        """Whether the next proposal will be empty as this one was (``auto``: its bandit keeps
        choosing plain decoding); the engine then runs the next step pipelined."""
        return False

    def use_lower_layers(self, lower: LowerLayers | None) -> None:
        """Draft through ``lower`` (the engine calls this before ``prefill`` when
        ``lower_layers`` > 0; None: run without the target's cache)."""
        raise NotImplementedError(f"{self.name} declares no lower_layers")

    def rewind(self, n: int) -> bool:
        """Forget the last ``n`` tokens shown; False when this drafter cannot (then prefill)."""
        return False

    def share_heads(self, on: bool) -> None:
        """Whether to leave a trained head's feed over accepted tokens to the batch (above)."""

    def head_feeds(self) -> list:
        """The drafters (this one or its arms) whose head feed is due (above)."""
        return []

    def prediction_tokens(self) -> tuple[int, int]:
        """(accepted, rejected): how many tokens drafted from the request's predicted output the
        target kept and rejected so far in this sequence (``prediction.py``; others: none)."""
        return 0, 0


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
