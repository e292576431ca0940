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
- :func:`verify_sampling_keyed` — **lossless** for sampling, and reproducible: the token at
  output position ``i`` is the target's (filtered) distribution's inverse CDF at a uniform
  keyed by (seed, i) alone (``sampling.keyed_uniform``), and a drafted child is accepted when
  it is that token. Each committed token is a fresh exact draw from the target's distribution
  after the tokens before it, so the output's distribution is the target's; and since the
  drafts only decide how many positions one forward settles, a seeded request gives the same
  tokens whatever drafts it is shown: with any method, beside any other requests, at any
  speed. A deterministic child is accepted with probability p(x), as under the rule above. A
  drafter that samples from ``q`` draws at the same keyed uniform (``sampling.draw``), so its
  draft is the verifier's token whenever the two inverse CDFs agree there (always when
  q == p): close to, though not always as high as, the sum_x min(p(x), q(x)) of the rule above.
- :func:`verify_sampling_uniforms` — the same rule given the uniforms: ``u[c]`` decides child
  ``c``'s accept test (each node is tested at most once), ``u[0]`` draws the bonus token by
  inverting the residual's CDF. ``verify_sampling`` draws ``u`` (N uniforms) from its generator
  first, so the host rule and the device kernel (``kernels/accept.py``) can be given the same
  draws. Distinct tests use distinct uniforms, so the rule stays lossless.

:func:`accept` applies the rule a :class:`SamplingConfig` calls for to a forward's logits; the
engine and the cascade's inner step both verify through it.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .config import SamplingConfig
from .kernels.accept import accept_greedy, accept_sampling
from .kernels.backend import metal_kernels
from .sampling import keyed_uniform, probs, sample_at
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
           width: int | None = None, at: int | None = None) -> tuple[Accepted, np.ndarray | None]:
    """Lossless: ``verify_greedy`` on the argmax (greedy ``cfg``) or ``verify_sampling`` on the
    filtered distributions of ``logits`` (N, V), padded to ``width`` columns when given; with a
    seed and ``at`` (the output position of the tree's first drafted token),
    ``verify_sampling_keyed`` instead.

    Returns the outcome and, when sampling, the distributions ``p`` (N, width or V) it used:
    on the host a :class:`RowProbs`, whose rows are computed as they are read.
    Where ``kernels.backend.metal_kernels`` runs the Metal kernels (a Mac's GPU, or emulation
    when asked), the walk runs in ``kernels/accept.py``'s kernels on the same inputs.
    """
    mode = metal_kernels()
    if cfg.greedy:
        argmax = mx.argmax(logits, axis=-1)
        if mode != "off":
            return _accepted(tree, *accept_greedy(tree.parents, tree.tokens, argmax, mode)), None
        return verify_greedy(tree, np.array(argmax)), None
    if cfg.seed is not None and at is not None:
        p = RowProbs(np.array(logits.astype(mx.float32)), cfg, width)
        return verify_sampling_keyed(tree, p, cfg.seed, at), p
    if mode != "off":  # the kernels take every row; the same uniforms verify_sampling draws
        p = _padded(probs(np.array(logits.astype(mx.float32)), cfg), width)
        return _accepted(tree, *accept_sampling(tree.parents, tree.tokens, p, tree.q,
                                                rng.random(len(tree)), mode)), p
    p = RowProbs(np.array(logits.astype(mx.float32)), cfg, width)
    return verify_sampling(tree, p, rng), p


def _padded(p: np.ndarray, width: int | None) -> np.ndarray:
    if width and p.shape[-1] < width:
        pad = [(0, 0)] * (p.ndim - 1) + [(0, width - p.shape[-1])]
        return np.pad(p, pad)
    return p


class RowProbs:
    """``probs(logits, cfg)`` (padded to ``width``), a row computed when it is first read.

    The walk reads only the rows of the nodes it visits (the accepted path and the node after
    it: about tau of a tree's N), and a filtered float64 row of a large vocabulary is costly
    on the host, so rows it never reads are not made (see docs/measurements.md, "Sampling rows
    computed as the walk reads them"). Each row is
    computed by ``probs`` on that row alone: the same numbers as in the whole array (a test
    compares them)."""

    def __init__(self, logits: np.ndarray, cfg: SamplingConfig, width: int | None = None):
        self.logits, self.cfg, self.width = logits, cfg, width
        self._rows: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self.logits.shape[0]

    def __getitem__(self, u) -> np.ndarray:
        u = int(u)
        if u not in self._rows:
            self._rows[u] = _padded(probs(self.logits[u : u + 1], self.cfg), self.width)[0]
        return self._rows[u]


def _accepted(tree: DraftTree, path: list[int], bonus: int) -> Accepted:
    return Accepted(path, [tree.tokens[i] for i in path[1:]] + [bonus])


def verify_greedy(tree: DraftTree, argmax: np.ndarray) -> Accepted:
    """Lossless (greedy). ``argmax[u]`` is the target's greedy token after node ``u``."""
    return _follow(tree, lambda u, depth: int(argmax[u]))


def verify_sampling_keyed(tree: DraftTree, p, seed: int, at: int) -> Accepted:
    """Lossless, reproducible (sampling). ``p[u]`` is the target's filtered distribution after
    node ``u``; the token after a node at depth d is drawn with ``keyed_uniform(seed, at + d)``."""
    return _follow(tree, lambda u, depth: sample_at(p[u], keyed_uniform(seed, at + depth)))


def _follow(tree: DraftTree, token_after) -> Accepted:
    """The rules whose token after each node is fixed whatever was drafted: from the root, the
    child drafting ``token_after(u, depth of u)`` is accepted while there is one; that token
    after the last accepted node is the bonus."""
    u, path = 0, [0]
    while True:
        want = token_after(u, len(path) - 1)
        nxt = next((c for c in tree.children(u) if tree.tokens[c] == want), None)
        if nxt is None:
            return Accepted(path, [tree.tokens[i] for i in path[1:]] + [want])
        u = nxt
        path.append(u)


def verify_sampling(tree: DraftTree, p: np.ndarray, rng: np.random.Generator) -> Accepted:
    """Lossless (sampling). ``p[u]`` is the target's filtered distribution after node ``u``."""
    return verify_sampling_uniforms(tree, p, rng.random(len(tree)))


def verify_sampling_uniforms(tree: DraftTree, p: np.ndarray, uniforms: np.ndarray) -> Accepted:
    """``verify_sampling`` given its uniforms: ``uniforms[c]`` for child ``c``'s accept test,
    ``uniforms[0]`` for the bonus draw."""
    u, path = 0, [0]
    while True:
        residual = p[u]
        chosen = None
        q_u = tree.q[u] if tree.q is not None else None
        for c in tree.children(u):
            x = tree.tokens[c]
            if q_u is None:
                accept, residual = _try_one_hot(residual, x, uniforms[c])
            else:
                accept, residual = _try_sampled(residual, q_u, x, uniforms[c])
            if accept:
                chosen = c
                break
        if chosen is None:
            drafts = [tree.tokens[i] for i in path[1:]]
            return Accepted(path, drafts + [sample_at(residual, uniforms[0])])
        u = chosen
        path.append(u)


def _try_one_hot(p: np.ndarray, x: int, u: float) -> tuple[bool, np.ndarray]:
    if u < p[x]:
        return True, p
    rest = p.copy()
    rest[x] = 0.0
    total = rest.sum()
    return False, (rest / total if total > 0 else p)


def _try_sampled(p: np.ndarray, q: np.ndarray, x: int, u: float) -> tuple[bool, np.ndarray]:
    if q[x] <= 0.0:
        # Cannot happen for a token really drawn from q; treat it as a one-hot proposal.
        return _try_one_hot(p, x, u)
    if u * q[x] < p[x]:
        return True, p
    rest = np.maximum(p - q, 0.0)
    total = rest.sum()
    return False, (rest / total if total > 0 else p)
