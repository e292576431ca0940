"""Draft confidence -> acceptance probability, learned online (for sizing trees by expected value).

A head's softmax probability for a drafted token is not the chance the target accepts it (a
random head is overconfident, a well-trained one may be under-confident). ``Calibration``
keeps, per confidence bucket, a decayed count of drafted nodes that were tried (their parent
was accepted) and of those accepted, starting from a prior that trusts the head
(``prior`` pseudo-observations at the bucket's centre); ``__call__`` maps confidences to the
observed rates, so the estimate adapts to the head, the text and the sampling temperature.

``choose(parents, confidence, calibration, curve, draft_ms, nodes)``: which drafted nodes to
verify: the best ``nodes`` by calibrated path probability, or (``nodes=None``) as many as
maximise expected tokens per ms on this device's verify-cost curve (``targets/cost.py``).

``top_k(logits, k)``: each row's k best columns, best first, on the host.

``path_probs(parents, edge)``: a node's probability of being accepted is the product of its
calibrated edge probabilities down from the root; it never exceeds its parent's, so sorting
nodes by it (parents first on ties) keeps every prefix of the order ancestor-closed.
"""

from __future__ import annotations

import numpy as np

from ..targets.cost import Budget, CostCurve, best_budget
from ..tree import DraftTree


class Calibration:
    def __init__(self, buckets: int = 10, prior: float = 2.0, decay: float = 0.995):
        self.buckets, self.decay = buckets, decay
        centres = (np.arange(buckets) + 0.5) / buckets
        self.tried = np.full(buckets, prior)
        self.hits = centres * prior

    def _bucket(self, confidence) -> np.ndarray:
        c = np.clip(np.asarray(confidence, dtype=np.float64), 0.0, 1.0)
        return np.minimum((c * self.buckets).astype(np.int64), self.buckets - 1)

    def __call__(self, confidence) -> np.ndarray:
        """Calibrated acceptance probabilities for draft confidences (any shape)."""
        b = self._bucket(confidence)
        return self.hits[b] / self.tried[b]

    def observe(self, confidence, accepted) -> None:
        """Record tried nodes: their confidences and whether the target accepted each."""
        b = self._bucket(confidence)
        if b.size == 0:
            return
        self.tried *= self.decay
        self.hits *= self.decay
        np.add.at(self.tried, b, 1.0)
        np.add.at(self.hits, b, np.asarray(accepted, dtype=np.float64))

    def observe_tree(self, tree: DraftTree, confidence: np.ndarray, path: list[int]) -> None:
        """Record a verified tree: ``confidence[u]`` is node u's draft probability (u >= 1);
        a node was tried when its parent is on the accepted ``path``."""
        on_path = set(path)
        tried = [u for u in range(1, len(tree)) if tree.parents[u] in on_path]
        self.observe(confidence[tried], [u in on_path for u in tried])


def path_probs(parents: list[int], edge: np.ndarray) -> np.ndarray:
    """Per node, the product of ``edge`` from the root down (the root's entry is 1)."""
    out = np.ones(len(parents))
    for u in range(1, len(parents)):
        out[u] = out[parents[u]] * edge[u]
    return out


def top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Each row's ``k`` largest columns of a 2-D float array, largest first (of equal values the
    lower column first): ``k`` passes of ``argmax``, each striking out what it found. For a few
    of thousands of columns that is much cheaper than ``np.argpartition``, an introselect over the
    whole row (docs/measurements.md, "the head's children on the host"). A row whose remaining
    best is -inf or NaN (fewer than ``k`` finite values) takes a full stable sort instead."""
    n = logits.shape[-1]
    if k >= n:
        return np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    work, rows = logits.copy(), np.arange(logits.shape[0])
    out = np.empty((logits.shape[0], k), dtype=np.int64)
    for i in range(k):
        best = work.argmax(axis=-1)
        found = work[rows, best]
        if not np.all(found > -np.inf):  # -inf or NaN: argmax could return a struck-out column
            return np.argsort(-logits, axis=-1, kind="stable")[:, :k]
        out[:, i] = best
        work[rows, best] = -np.inf
    return out


def best_first(probs: np.ndarray) -> np.ndarray:
    """Node ids 1.. sorted by decreasing ``probs``, parents before children on ties."""
    ids = np.arange(1, len(probs))
    return ids[np.lexsort((ids, -probs[1:]))]


def choose(parents: list[int], confidence: np.ndarray, calibration: Calibration,
           curve: CostCurve | None, draft_ms: float, nodes: int | None,
           limit: int) -> tuple[np.ndarray, Budget | None]:
    """The drafted nodes to verify (ids, ancestor-closed, best first) and, when sized by the
    cost curve (``nodes=None``), the budget chosen. At most ``limit`` nodes either way."""
    probs = path_probs(parents, calibration(confidence))
    order = best_first(probs)
    if nodes is not None:
        return order[: min(nodes, limit)], None
    budget = best_budget(probs[order], curve, draft_ms, limit=limit)
    return order[: budget.nodes], budget
