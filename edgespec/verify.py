"""Acceptance rules: which drafted nodes the target keeps, and the bonus token after them.

Each rule is a pure function of the tree and the target's scores for every node, and returns an
:class:`Accepted`: the path of accepted node indices from the root (node 0 is always on it) and
the committed tokens (accepted drafts followed by one token chosen by the target, the bonus).

- :func:`verify_greedy` — **lossless** for temperature 0: the committed tokens are exactly what
  target-only greedy decoding produces.
- :func:`verify_sampling` — **lossless** for sampling: recursive rejection sampling over the
  children of each node. A child drawn from the drafter's distribution ``q`` is accepted with
  probability ``min(1, p(x) / q(x))`` and on rejection ``p <- norm(max(0, p - q))`` (Leviathan et
  al. / Chen et al. for a chain, SpecInfer's multi-draft form for siblings drawn i.i.d. from
  ``q``). A deterministic child (no ``q``) is a one-hot proposal: accepted with probability
  ``p(x)``, and on rejection ``p <- norm(p with x removed)``. Either way every committed token is
  distributed exactly as the target's (filtered) distribution.

:func:`accept` applies the rule a :class:`SamplingConfig` calls for to a forward's logits; the
engine and the cascade's inner step both verify through it.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .config import SamplingConfig
from .sampling import probs, sample
from .tree import DraftTree


@dataclass(frozen=True)
class Accepted:
    path: list[int]  # accepted node indices, starting with the root 0
    tokens: list[int]  # accepted draft tokens followed by the bonus token

    @property
    def num_accepted(self) -> int:
        """Drafted tokens the target kept (the bonus token not counted)."""
        return len(self.path) - 1


def accept(tree: DraftTree, logits: mx.array, cfg: SamplingConfig, rng: np.random.Generator,
           width: int | None = None) -> tuple[Accepted, np.ndarray | None]:
    """Lossless: ``verify_greedy`` on the argmax (greedy ``cfg``) or ``verify_sampling`` on the
    filtered distributions of ``logits`` (N, V), padded to ``width`` columns when given.

    Returns the outcome and, when sampling, the distributions ``p`` (N, width or V) it used.
    """
    if cfg.greedy:
        return verify_greedy(tree, np.array(mx.argmax(logits, axis=-1))), None
    p = probs(np.array(logits.astype(mx.float32)), cfg)
    if width and p.shape[1] < width:
        p = np.pad(p, ((0, 0), (0, width - p.shape[1])))
    return verify_sampling(tree, p, rng), p


def verify_greedy(tree: DraftTree, argmax: np.ndarray) -> Accepted:
    """Lossless (greedy). ``argmax[u]`` is the target's greedy token after node ``u``."""
    u, path = 0, [0]
    while True:
        want = int(argmax[u])
        nxt = next((c for c in tree.children(u) if tree.tokens[c] == want), None)
        if nxt is None:
            drafts = [tree.tokens[i] for i in path[1:]]
            return Accepted(path, drafts + [want])
        u = nxt
        path.append(u)


def verify_sampling(tree: DraftTree, p: np.ndarray, rng: np.random.Generator) -> Accepted:
    """Lossless (sampling). ``p[u]`` is the target's filtered distribution after node ``u``."""
    u, path = 0, [0]
    while True:
        residual = p[u]
        chosen = None
        q_u = tree.q[u] if tree.q is not None else None
        for c in tree.children(u):
            x = tree.tokens[c]
            if q_u is None:
                accept, residual = _try_one_hot(residual, x, rng)
            else:
                accept, residual = _try_sampled(residual, q_u, x, rng)
            if accept:
                chosen = c
                break
        if chosen is None:
            drafts = [tree.tokens[i] for i in path[1:]]
            return Accepted(path, drafts + [sample(residual, rng)])
        u = chosen
        path.append(u)


def _try_one_hot(p: np.ndarray, x: int, rng: np.random.Generator) -> tuple[bool, np.ndarray]:
    if rng.random() < p[x]:
        return True, p
    rest = p.copy()
    rest[x] = 0.0
    total = rest.sum()
    return False, (rest / total if total > 0 else p)


def _try_sampled(p: np.ndarray, q: np.ndarray, x: int,
                 rng: np.random.Generator) -> tuple[bool, np.ndarray]:
    if q[x] <= 0.0:
        # Cannot happen for a token really drawn from q; treat it as a one-hot proposal.
        return _try_one_hot(p, x, rng)
    if rng.random() * q[x] < p[x]:
        return True, p
    rest = np.maximum(p - q, 0.0)
    total = rest.sum()
    return False, (rest / total if total > 0 else p)
