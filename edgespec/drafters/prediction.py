"""Predicted outputs: draft the text the request says the answer will mostly be.

An editor that asks for a file to be rewritten sends the current file as the *prediction*
(OpenAI's ``prediction: {"type": "content", "content": ...}``). This drafter keeps a pointer
into the prediction's token ids: while the committed tokens follow the prediction it proposes
the prediction's continuation from the pointer as one long chain (an edit keeps most of the
file, so most of the answer is copied in a few target forwards).

Alignment after a divergence (the model inserted, deleted or changed something): the pointer is
lost and found again from the last few committed tokens. Every n-gram of the prediction
(n in ``[1, max_ngram]``) is indexed to the positions that follow it; the longest suffix of the
history that occurs in the prediction wins, and among its occurrences the nearest one at or
after the last aligned position (an edit moves forward through the file), else the nearest
before it (the model repeated something). A short match earns a short chain; each fully
accepted chain doubles the next one, up to ``max_chain``. Each chain in a row rejected at its
first token makes re-alignment ask for a one token longer match (up to ``max_ngram``).
A 1-token match counts only just after the last aligned position, and only once settings ask
for it (``MIN_MATCH``): in code a single token is often a newline or an indent.

Where the prediction has nothing to say (the new text of an edit, or after the prediction's
end) the ``inner`` drafter proposes: the request's own method. It sees every committed token
(an empty tree in ``update`` when the prediction proposed, as ``auto`` keeps its arms in step),
so it must be a drafter that stays in step with proposals it did not make (``auto``'s arms:
``with_prediction`` chooses).

Deterministic proposals (no ``q``): lossless for greedy and sampling alike, as prompt lookup.
It counts the prediction tokens it drafted that the target kept and rejected
(``prediction_tokens()``; the engine copies them into ``Stats.accepted_prediction_tokens`` /
``rejected_prediction_tokens``, OpenAI's ``usage.completion_tokens_details``): rejected ones
were verified in the same forwards as the kept ones, and are not part of the answer.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict

from ..config import SamplingConfig
from ..targets.target import TargetOutput
from ..tree import DraftTree
from ..verify import Accepted
from .base import Drafter

SOURCE = "prediction"  # the DraftTree.source of the nodes this drafter proposes


class PredictionIndex:
    """Where each n-gram (n in [1, hi]) of a fixed token sequence occurs: the positions right
    after its occurrences, ascending."""

    def __init__(self, tokens: list[int], hi: int):
        self.tokens, self.hi = list(tokens), hi
        self.follow: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for end in range(1, len(tokens) + 1):
            for n in range(1, min(hi, end) + 1):
                self.follow[tuple(tokens[end - n : end])].append(end)

    def find(self, history: list[int], near: int, reach: int,
             shortest: int = 1) -> tuple[int, int] | None:
        """(match length, position after it) of the longest suffix of ``history`` found, at the
        occurrence nearest at or after ``near``, else nearest before it; None when not found.
        A 1-token match counts only within ``reach`` positions after ``near`` (a skipped line
        or two): further away it is as likely chance as not. Matches shorter than ``shortest``
        do not count."""
        for n in range(min(self.hi, len(history)), shortest - 1, -1):
            ends = self.follow.get(tuple(history[len(history) - n :]))
            if not ends:
                continue
            i = bisect_left(ends, near)
            if n > 1:
                return n, ends[i] if i < len(ends) else ends[-1]
            if i < len(ends) and ends[i] - near <= reach:
                return n, ends[i]
        return None


class PredictionDrafter(Drafter):
    """Drafts from ``prediction`` (token ids) while aligned, else through ``inner`` (or not)."""

    name = SOURCE

    # Chain length by the match that re-aligned the pointer (1, 2, 3, 4+ tokens), how far past
    # the last aligned position a 1-token match may re-align, and the shortest match that
    # re-aligns before any miss: chosen by replaying the demo model's greedy answers to the
    # edits workload against its cost curve (scripts/prediction_sim.py; docs/measurements.md,
    # "Predicted outputs: the edits workload").
    _REACH = (0, 1, 2, 4, 8)
    SKIP = 16
    MIN_MATCH = 2

    def __init__(self, prediction: list[int], inner: Drafter | None = None,
                 max_chain: int = 32, max_ngram: int = 4):
        self.index = PredictionIndex(prediction, max_ngram)
        self.inner, self.max_chain = inner, max_chain
        if inner is not None:
            self.name = f"{SOURCE}+{inner.name}"
        self.reset()

    @property
    def prediction(self) -> list[int]:
        return self.index.tokens

    # the inner drafter's needs are the engine's to honour (EAGLE-3's features)
    @property
    def target_features(self) -> tuple[int, ...]:
        return self.inner.target_features if self.inner is not None else ()

    @property
    def wants_hidden(self) -> bool:
        return self.inner is not None and self.inner.wants_hidden

    def reset(self) -> None:
        self.history: list[int] = []
        self.drafted = 0  # tokens of the prediction in the pending proposal (0: not ours)
        self.kept = self.rejected = 0  # prediction tokens the target kept / rejected
        self.misses = 0  # prediction chains in a row whose first token was rejected
        self.pointer: int | None = 0  # next expected prediction position; None: lost
        self.mark = 0  # the last position known to be aligned (where re-alignment looks first)
        self.chain = min(self._REACH[-1], self.max_chain)  # the next chain's length
        if self.inner is not None:
            self.inner.reset()

    def prefill(self, tokens: list[int], target_out: TargetOutput | None,
                sampling: SamplingConfig | None = None) -> None:
        self.reset()
        self.history = list(tokens)
        if self.inner is not None:
            self.inner.prefill(tokens, target_out, sampling)

    def _ahead(self) -> int:
        """Prediction tokens left after the pointer (0 when lost)."""
        return 0 if self.pointer is None else len(self.prediction) - self.pointer

    def propose(self, budget: int) -> DraftTree:
        root = self.history[-1]
        if budget <= 0:
            return DraftTree.chain(root, [])
        k = self.drafted = min(self.chain, self.max_chain, budget, self._ahead())
        if k > 0:
            drafts = self.prediction[self.pointer : self.pointer + k]
            return DraftTree([root, *drafts], list(range(-1, k)), source=["root"] + [SOURCE] * k)
        if self.inner is not None:
            return self.inner.propose(budget)
        return DraftTree.chain(root, [])

    def prediction_tokens(self) -> tuple[int, int]:
        return self.kept, self.rejected

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput | None) -> None:
        # the engine may verify a changed tree (rules cut drafts or add forced ones) and then
        # show this drafter its own tree and the outcome on it, in one or two updates: whether
        # a tree is ours is read from the tree itself
        mine = self.drafted > 0 and tree.source is not None and SOURCE in tree.source
        if self.inner is not None:
            self.inner.update(accepted, DraftTree.chain(tree.tokens[0], []) if mine else tree,
                              target_out)
        if mine:  # a chain of the prediction: its accepted part is aligned by construction
            full = accepted.num_accepted == tree.num_drafted
            self.kept += accepted.num_accepted
            self.rejected += tree.num_drafted - accepted.num_accepted
            self.drafted = 0
            self.misses = 0 if accepted.num_accepted else self.misses + 1
            self.chain = min(2 * self.chain, self.max_chain) if full else self.chain
            self.pointer += accepted.num_accepted
            self._follow(accepted.tokens[accepted.num_accepted :])
        else:
            self._follow(accepted.tokens)
        self.history.extend(accepted.tokens)
        if self.pointer is None or self._ahead() == 0:
            self._realign()

    def _follow(self, tokens: list[int]) -> None:
        """Advance the pointer over ``tokens`` while they equal the prediction's; lose it at the
        first that does not."""
        for t in tokens:
            if self._ahead() and self.prediction[self.pointer] == t:
                self.pointer += 1
            else:
                self.mark = self.mark if self.pointer is None else self.pointer
                self.pointer = None
                return
        self.mark = self.pointer

    def _realign(self) -> None:
        """Find the pointer again from the last committed tokens (see the module docstring)."""
        # each chain in a row rejected outright (the answer has left the prediction: prose after
        # the code) asks one more token of evidence before the next
        shortest = min(self.MIN_MATCH + self.misses, self.index.hi)
        found = self.index.find(self.history, self.mark, self.SKIP, shortest)
        if found is None:
            self.pointer = None
            return
        n, self.pointer = found
        reach = self._REACH[min(n, len(self._REACH) - 1)]
        # re-joined just after where it left (a token changed, a line skipped): the file goes on
        near = 0 <= self.pointer - self.mark <= self.SKIP
        self.chain = min(max(reach, self.chain // 2) if near else reach, self.max_chain)
        self.mark = self.pointer


ALIGNED = 0.95  # the modelled chance that an aligned answer keeps following the prediction


def chain_cap(curve) -> int:
    """The longest chain worth verifying on this device: the k that maximises the expected
    committed tokens ``(1 - a^(k+1)) / (1 - a)`` (each drafted token kept with chance
    ``a = ALIGNED`` while the previous one was) per ms of a (k+1)-node forward
    (``targets.cost.CostCurve``). A CPU, where a forward's cost grows steeply with its nodes,
    gets a short chain; a GPU, where it hardly grows, the longest the curve covers (63)."""
    def rate(k: int) -> float:
        return (1 - ALIGNED ** (k + 1)) / (1 - ALIGNED) / curve.ms(k + 1)

    return max(range(1, 64), key=rate)


def with_prediction(spec, target, sampling, draft, prediction: list[int]) -> Drafter:
    """A request with a predicted output: the prediction drafts while the answer follows it,
    and the request's method drafts where it does not. A method that stays in step with
    proposals it did not make (one of ``auto``'s arms: plain decoding, lookup, the draft model,
    EAGLE-3, the corpus, the MTP layer) is used as it is (plain decoding: the prediction
    alone); any other (``auto`` itself, lookahead, the self-drafts, Medusa, cascade) is
    replaced by prompt lookup.
    Its chains are as long as this device's cost curve pays for (``chain_cap``; not adaptive:
    ``max_draft``)."""
    from ..targets.cost import verify_cost_curve
    from .lookup import PromptLookupDrafter
    from .registry import BUILDERS, get

    method = get(spec.method)
    if method.arm:
        inner = BUILDERS[spec.method](spec, target, sampling, draft)
    else:
        inner = PromptLookupDrafter(num_draft=spec.num_draft, max_draft=spec.max_draft)
    longest = chain_cap(verify_cost_curve(target)) if spec.adaptive else spec.max_draft
    return PredictionDrafter(list(prediction), inner, max_chain=longest)
