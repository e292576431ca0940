"""Medusa drafting: K trained heads over the target's last hidden state propose a static tree.

Head i applied to the (final-normed) hidden state of the last committed position t predicts the
token at t+2+i: head 0 the root's children, head 1 their children, and so on. The heads do not
see each other's choices, so the tree is a product: a shape ``(w_1, w_2, ...)`` (data, named by
its shape) takes head 0's top ``w_1`` tokens below the root, head 1's top ``w_2`` below each of
those, ... Each node's confidence is its head's probability for its token; the tree is cut to
the nodes with the best calibrated path probabilities (``confidence.py``): ``nodes`` of them, or
as many as this device's verify-cost curve pays for (``targets/cost.py``).

The shape is chosen once per head from its measured per-head top-k accuracy, when its
``recipe.json`` has ``topk_accuracy`` (per head, the held-out accuracy of its top-1, top-2, ...
guesses): the shape in ``SHAPES`` with the most expected tokens per ms of verification on the
cost curve; otherwise ``DEFAULT_SHAPE``.

Heads with a draft vocabulary (``heads/medusa.py``) read only its rows of the shared LM head
(one float copy, made here) and propose only its tokens; their confidences are probabilities
over it.

Proposals are deterministic (no ``q``): lossless under greedy and sampling through
``verify.accept``. The drafter needs the target's last hidden state: in prefill (the
``wants_hidden`` ability) and after each verification (the accepted path's last node).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..config import SamplingConfig
from ..heads.medusa import target_lm_head_rows
from ..kernels.matmul import linear, small_matmul
from ..targets.cost import CostCurve
from ..targets.target import Target, TargetOutput
from ..tree import DraftTree, subtree
from ..verify import Accepted
from .base import Drafter
from .confidence import Calibration, choose

SHAPES: tuple[tuple[int, ...], ...] = (
    (1,), (2,), (1, 1), (2, 1), (3, 1), (2, 2), (1, 1, 1), (2, 1, 1), (3, 2, 1), (4, 2, 1),
    (2, 1, 1, 1), (3, 2, 1, 1), (4, 2, 1, 1), (5, 3, 2, 1), (8, 4, 2, 1),
)
DEFAULT_SHAPE = (4, 2, 1, 1)
_EMA = 0.8


def product_tree(shape: tuple[int, ...]) -> tuple[list[int], list[int], list[int]]:
    """The static tree of ``shape``: (parents, depth, rank) per node, root first; ``rank`` is
    the node's place in its head's top-k (0 = the head's best guess)."""
    parents, depth, rank = [-1], [0], [0]
    level = [0]
    for d, width in enumerate(shape, start=1):
        nxt = []
        for u in level:
            for r in range(width):
                parents.append(u)
                depth.append(d)
                rank.append(r)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents, depth, rank


def choose_shape(topk_accuracy, curve: CostCurve, num_heads: int) -> tuple[int, ...]:
    """The shape in ``SHAPES`` (at most ``num_heads`` deep) with the most expected committed
    tokens per ms of verification, from per-head top-k accuracies (independent heads assumed)."""
    best, best_rate = DEFAULT_SHAPE[:num_heads], -1.0
    for shape in SHAPES:
        if len(shape) > num_heads or any(w > len(topk_accuracy[i]) for i, w in enumerate(shape)):
            continue
        expected, reach, nodes, width = 1.0, 1.0, 0, 1
        for i, w in enumerate(shape):
            reach *= topk_accuracy[i][w - 1]  # some guess of depths 1..i+1 is right
            expected += reach
            width *= w
            nodes += width
        rate = expected / curve.ms(nodes + 1)
        if rate > best_rate:
            best, best_rate = shape, rate
    return best


class MedusaDrafter(Drafter):
    name = "medusa"
    wants_hidden = True

    def __init__(self, target: Target, heads, curve: CostCurve | None, *,
                 shape: tuple[int, ...] | None = None, recipe_dir: Path | None = None,
                 nodes: int | None = None, max_nodes: int = 32):
        """``heads``: ``MedusaHeads`` for ``target``; ``shape``: the static tree (default: chosen
        from ``recipe_dir``'s recipe.json, else ``DEFAULT_SHAPE``); ``nodes``: verify that many
        drafted nodes per step (None: sized by ``curve`` and the calibration)."""
        assert nodes is not None or curve is not None, "a fixed node count or a cost curve"
        k = heads.config.num_heads
        self.target, self.heads, self.curve = target, heads, curve
        self.shape = tuple(shape or _recipe_shape(recipe_dir, curve, k) or DEFAULT_SHAPE)[:k]
        self.parents, self.depth, self.rank = product_tree(self.shape)
        self.nodes, self.max_nodes = nodes, min(max_nodes, 63)
        # the shared LM head: the tied embedding or the target's lm_head
        self.lm_head = None if heads.config.own_lm_head else target.model.output_head()
        # with a draft vocabulary: one float copy of those rows of the shared head
        self.ids = heads.draft_ids
        self.rows = None if self.ids is None else target_lm_head_rows(target, self.ids)
        self.calibration = Calibration()
        self.draft_ms = 0.0
        self.reset()

    def reset(self) -> None:
        self.history: list[int] = []
        self.hidden: mx.array | None = None  # (1, H) at the position before the root
        self._tree: DraftTree | None = None
        self._confidence: np.ndarray | None = None

    def prefill(self, tokens: list[int], target_out: TargetOutput | None,
                sampling: SamplingConfig | None = None) -> None:
        rows = target_out.hidden.shape[0] if target_out is not None else 0
        same = len(self.history) == len(tokens) and self.history[:-1] == tokens[:-1]
        if rows:
            self.hidden = target_out.hidden[-1:]
        elif not same:  # the engine reused its cache and this drafter has no state for it
            self.hidden = None
        self.history = list(tokens)
        self._tree = None

    def propose(self, budget: int) -> DraftTree:
        root = self.history[-1]
        self._tree = None
        if budget <= 0 or self.hidden is None:
            return DraftTree.chain(root, [])
        t0 = time.perf_counter()
        depth = min(len(self.shape), budget)
        normed = self.target.model.model.norm(self.hidden)
        logits = self._logits(normed, depth).astype(mx.float32)  # (depth, V)
        widest = max(self.shape[:depth])
        # each head's best ``widest`` tokens, best first, and their probabilities: a partition
        # and a log-sum-exp over the vocabulary rather than a full softmax and sort
        best = mx.argpartition(-logits, widest - 1, axis=-1)[:, :widest]
        vals = mx.take_along_axis(logits, best, axis=-1)
        order = mx.argsort(-vals, axis=-1)
        top = mx.take_along_axis(best, order, axis=-1)
        top_p = mx.exp(mx.take_along_axis(vals, order, axis=-1)
                       - mx.logsumexp(logits, axis=-1, keepdims=True))
        top, top_p = np.array(top), np.array(top_p)
        if self.ids is not None:
            top = self.ids[top]  # rows of the draft vocabulary -> target ids
        n = sum(1 for d in self.depth if d <= depth)  # nodes of the first ``depth`` levels
        tokens = [root] + [int(top[self.depth[u] - 1, self.rank[u]]) for u in range(1, n)]
        conf = np.array([1.0] + [top_p[self.depth[u] - 1, self.rank[u]] for u in range(1, n)])
        keep, _ = choose(self.parents[:n], conf, self.calibration, self.curve, self.draft_ms,
                         self.nodes, self.max_nodes)
        tree = subtree(tokens, self.parents[:n], keep)
        self._tree, self._confidence = tree, np.concatenate([[1.0], conf[np.sort(keep)]])
        ms = (time.perf_counter() - t0) * 1e3
        self.draft_ms = ms if not self.draft_ms else _EMA * self.draft_ms + (1 - _EMA) * ms
        return tree

    def _logits(self, normed: mx.array, depth: int) -> mx.array:
        """The first ``depth`` heads' logits (depth, V; (depth, Vd) over a draft vocabulary):
        only the heads the tree reaches, and
        with the target's shared LM head one (depth, H) x (H, V) product rather than ``depth``
        matrix-vector ones (the LM head is most of a small model's head cost)."""
        heads = self.heads.heads[:depth]
        if self.lm_head is None:
            return mx.concatenate([head(normed, None) for head in heads])
        x = mx.concatenate([_blocks(head, normed) for head in heads])
        return linear(self.lm_head, x) if self.rows is None else small_matmul(x, self.rows)

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput) -> None:
        if tree is self._tree and tree.num_drafted:
            self.calibration.observe_tree(tree, self._confidence, accepted.path)
        self._tree = None
        self.hidden = target_out.hidden[accepted.path[-1] :][:1]
        self.history.extend(accepted.tokens)


def _blocks(head, x: mx.array) -> mx.array:
    """A Medusa head's residual blocks without its LM head."""
    for block in head.blocks:
        x = block(x)
    return x


def _recipe_shape(head_dir: Path | None, curve: CostCurve | None, num_heads: int):
    """The shape the head's recipe.json's ``topk_accuracy`` and the curve favour, or None."""
    if head_dir is None or curve is None:
        return None
    try:
        recipe = json.loads((Path(head_dir) / "recipe.json").read_text())
    except (OSError, ValueError):
        return None
    acc = recipe.get("topk_accuracy") if isinstance(recipe, dict) else None
    if not acc:
        return None
    return choose_shape(acc, curve, min(num_heads, len(acc)))
