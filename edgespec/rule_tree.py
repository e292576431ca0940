"""A step's draft tree under :class:`~edgespec.rules.Rules`: what the target verifies, and what the
drafter is told afterwards.

``shape`` turns the drafter's tree into the verified one:

1. **cut**: a drafted node whose token a rule forbids after its parent (``Rules.allows``) goes,
   with its subtree: the target would never accept it, so scoring it is wasted;
2. **forced runs**: the tokens the rules force (one allowed token at a time, ``Rules.forced``)
   after the root, and after the deepest node that is left, are added as a chain (merged with
   drafted nodes that already hold them), within the step's depth budget and a small forward's
   32 rows (or the drafted tree's size, when larger, up to the tree kernels' 64 nodes). A forced token is a free draft: the transformed target row allows nothing
   else, so it is always accepted.

``masked_q`` then conditions each sampled node's draft distribution on the rules' allowed set:
row ``u`` of ``q`` becomes ``q[u] * allowed[u] / q[u](allowed[u])``, with ``allowed[u]`` the
tokens whose transformed target logit at ``u`` is finite. Why this keeps recursive rejection
sampling exact: the children of ``u`` were drawn i.i.d. from ``q[u]``; the cut keeps those in the
allowed set, and given which draws were kept, the kept ones are i.i.d. draws from ``q[u]``
conditioned on that set, i.e. from the masked row. The verifier's guarantee (each committed
token distributed as the target row ``p[u]``) holds for any number of i.i.d. drafts from the
``q`` it is given, so it holds for the kept ones and the masked row, and, when every draft was
cut, for the bonus token drawn from ``p[u]`` itself. (``p[u]`` is zero outside the allowed set,
so the masked row loses nothing the target could accept.) ``tests/test_rules.py`` checks it
with a sampling drafter against the exact constrained distribution, and that the unmasked
``q`` fails the same check. A node given a forced child has its ``q`` row zeroed: its children
are then one-hot proposals, lossless whatever chose them (even a run a rule forced wrongly).

``views`` tells the drafter what happened in terms of *its own* tree (drafters index their
proposals: a draft model's cache holds its chain, EAGLE-3 and Medusa pair target rows with the
accepted path): the verified path mapped back to drafted node ids, the target rows re-indexed
to the drafted tree (a cut node gets its nearest kept ancestor's row; drafters read only the
path's rows), the committed tokens up to and including the first token past the drafted nodes;
then, when the path went on through forced nodes, a second update in the form every drafter
already takes for a step some other drafter proposed (``auto``'s arms): an empty tree at the
first forced token, the path of the forced nodes with their target rows, and the rest of the
tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .kernels.backend import SMALL_M_MAX
from .kernels.tree_mask import MAX_NODES
from .rules import Rules
from .targets.target import TargetOutput
from .tree import DraftTree
from .verify import Accepted

FORCED_RUN = 16
"""The most forced tokens added after one node (a schema's fixed text is seldom longer; the
next step adds the rest)."""


@dataclass
class RuledTree:
    drafted: DraftTree  # the drafter's own tree
    tree: DraftTree  # the tree the target verifies
    origin: list[int]  # per verified node: its drafted node, or -1 for a forced one

    @property
    def same(self) -> bool:
        return self.tree is self.drafted

    def forced(self, path: list[int]) -> int:
        """How many of ``path``'s nodes (the accepted ones) are forced ones."""
        return sum(self.origin[u] < 0 for u in path)


def shape(drafted: DraftTree, rules: Rules, budget: int) -> RuledTree:
    """The verified tree of ``drafted`` under ``rules`` (see the module docstring); no node deeper
    than ``budget`` drafts is added."""
    ok = rules.allows(drafted) if drafted.num_drafted else np.ones(1, dtype=bool)
    kept = [0]
    alive = np.zeros(len(drafted), dtype=bool)
    alive[0] = True
    for u in range(1, len(drafted)):
        alive[u] = ok[u] and alive[drafted.parents[u]]
        if alive[u]:
            kept.append(u)
    index = {u: i for i, u in enumerate(kept)}
    tokens = [drafted.tokens[u] for u in kept]
    parents = [-1] + [index[drafted.parents[u]] for u in kept[1:]]
    origin = list(kept)
    depth = [0] * len(kept)
    for i in range(1, len(kept)):
        depth[i] = depth[parents[i]] + 1

    # Forced rows stay within a small forward (the native kernels' rows): past it a forward's
    # cost jumps (docs/measurements.md, "Quiet-machine runs": forwards past 32 rows); a larger
    # drafted tree keeps the tree kernels' limit.
    cap = max(SMALL_M_MAX, min(len(tokens), MAX_NODES))

    def graft(at: int, run: list[int]) -> None:
        for t in run[: max(cap - len(tokens), 0)]:
            nxt = next((c for c in range(len(tokens)) if parents[c] == at and tokens[c] == t), None)
            if nxt is None:
                tokens.append(t)
                parents.append(at)
                origin.append(-1)
                depth.append(depth[at] + 1)
                nxt = len(tokens) - 1
            at = nxt

    if budget > 0:
        graft(0, rules.forced([], min(budget, FORCED_RUN)))
        leaf = max(range(len(tokens)), key=lambda i: (depth[i], -i))
        room = min(budget - depth[leaf], FORCED_RUN)
        if leaf and room > 0:
            graft(leaf, rules.forced(_path_tokens(tokens, parents, leaf), room))
    if origin == list(range(len(drafted))):
        return RuledTree(drafted, drafted, origin)
    q = None
    if drafted.q is not None:
        q = np.zeros((len(tokens), drafted.q.shape[-1]), dtype=drafted.q.dtype)
        own = [i for i, d in enumerate(origin) if d >= 0]
        q[own] = drafted.q[[origin[i] for i in own]]
        # a forced node is not a draw from its parent's q: that row's children are one-hot
        # proposals (lossless whatever chose them, even a forced run the rows do not force)
        q[[parents[i] for i, d in enumerate(origin) if d < 0]] = 0.0
    source = None
    if drafted.source is not None:
        source = [drafted.source[d] if d >= 0 else "forced" for d in origin]
    return RuledTree(drafted, DraftTree(tokens, parents, q, source), origin)


def _path_tokens(tokens: list[int], parents: list[int], u: int) -> list[int]:
    out = []
    while u > 0:
        out.append(tokens[u])
        u = parents[u]
    return out[::-1]


def masked_q(tree: DraftTree, logits: mx.array) -> DraftTree:
    """``tree`` with each row of ``q`` that has children conditioned on the tokens ``logits``
    (the rules' transformed rows, -inf where forbidden) allow; a row with no allowed mass
    becomes zeros (its children, if any, are then verified as one-hot proposals)."""
    if tree.q is None:
        return tree
    rows = sorted({p for p in tree.parents[1:]})
    if not rows:
        return tree
    lg = np.array(logits[mx.array(rows)].astype(mx.float32))
    width = tree.q.shape[-1]
    allowed = np.zeros((len(rows), width), dtype=bool)
    w = min(width, lg.shape[-1])
    allowed[:, :w] = lg[:, :w] > -np.inf
    q = tree.q.copy()
    sub = q[rows] * allowed
    total = sub.sum(-1, keepdims=True)
    q[rows] = np.where(total > 0, sub / np.where(total > 0, total, 1.0), 0.0)
    return DraftTree(tree.tokens, tree.parents, q, tree.source)


def _gather(out: TargetOutput, rows: list[int]) -> TargetOutput:
    idx = mx.array(rows, dtype=mx.int32)
    return TargetOutput(None if out.logits is None else out.logits[idx], out.hidden[idx],
                        {k: v[idx] for k, v in out.captured.items()})


def views(rt: RuledTree, acc: Accepted,
          out: TargetOutput) -> list[tuple[Accepted, DraftTree, TargetOutput]]:
    """What the drafter's ``update`` is given, in order, for verifying ``rt.tree`` with outcome
    ``acc`` and target rows ``out`` (see the module docstring)."""
    if rt.same:
        return [(acc, rt.drafted, out)]
    where = {d: v for v, d in enumerate(rt.origin) if d >= 0}
    rows = []
    for d in range(len(rt.drafted)):  # a cut node: its nearest kept ancestor's row
        u = d
        while u not in where:
            u = rt.drafted.parents[u]
        rows.append(where[u])
    path = acc.path
    a = next((i for i, v in enumerate(path) if rt.origin[v] < 0), len(path))
    own = Accepted([rt.origin[v] for v in path[:a]],
                   acc.tokens[:a] if a < len(path) else acc.tokens)
    first = [(own, rt.drafted, _gather(out, rows))]
    if a == len(path):
        return first
    tail = path[a:]
    rest = Accepted(list(range(len(tail))), acc.tokens[a:])
    return first + [(rest, DraftTree.chain(rt.tree.tokens[tail[0]], []), _gather(out, tail))]
