"""Logits -> probabilities under a SamplingConfig, and drawing from them.

``probs`` is the single place where temperature, top-k, top-p and min-p are applied. The
verifier applies it to the target's logits (p) and every sampling drafter applies it to its own
logits (q): lossless rejection sampling needs both filtered by the same rule.
Order of filters, as in common practice: temperature, then top-k, then top-p, then min-p.
"""

from __future__ import annotations

import numpy as np

from .config import SamplingConfig


def probs(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """Rows of ``logits`` (..., V) -> rows of probabilities (float64, each summing to 1).

    Greedy (temperature 0) gives the one-hot of the argmax, so greedy is a special case of the
    same acceptance math.
    """
    x = np.asarray(logits, dtype=np.float64)
    if cfg.greedy:
        out = np.zeros_like(x)
        np.put_along_axis(out, x.argmax(-1)[..., None], 1.0, axis=-1)
        return out
    x = x / cfg.temperature
    x = x - x.max(-1, keepdims=True)
    if cfg.top_k and cfg.top_k < x.shape[-1]:
        kth = -np.partition(-x, cfg.top_k - 1, axis=-1)[..., cfg.top_k - 1 : cfg.top_k]
        x = np.where(x >= kth, x, -np.inf)
    p = np.exp(x)
    p /= p.sum(-1, keepdims=True)
    if cfg.top_p < 1.0:
        p = _top_p(p, cfg.top_p)
    if cfg.min_p > 0.0:
        p = np.where(p >= cfg.min_p * p.max(-1, keepdims=True), p, 0.0)
    return p / p.sum(-1, keepdims=True)


def _top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p``."""
    order = np.argsort(-p, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=-1)
    mass_before = np.cumsum(sorted_p, axis=-1) - sorted_p
    keep_sorted = mass_before < top_p  # the top token always survives
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return np.where(keep, p, 0.0)


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one index from a probability vector by inverting its CDF."""
    return sample_at(p, rng.random())


def sample_at(p: np.ndarray, u: float) -> int:
    """The index where the CDF of ``p`` (not necessarily normalised) first exceeds ``u`` times
    its total: a draw from ``p`` when ``u`` is uniform in [0, 1)."""
    cdf = np.cumsum(p)
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return min(i, len(p) - 1)


def keyed_uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) that depends on (seed, position) alone: the draw of a seeded
    request's token at output ``position`` (``verify.verify_sampling_keyed``)."""
    return float(np.random.default_rng([seed, 2, position]).random())


def draw(q: np.ndarray, cfg: SamplingConfig, rng: np.random.Generator,
         position: int) -> int:
    """A drafter's draw from its distribution ``q`` for the token at output ``position``: with
    a seed, at the uniform the verifier keys to that position (``keyed_uniform``), so a draft
    from a ``q`` close to the target's ``p`` is likely the very token the verifier draws (every
    one of them when q == p); without one, from ``rng``. Either way the verifier's rule decides
    what is committed, so this changes acceptance, never the output."""
    if cfg.seed is not None:
        return sample_at(q, keyed_uniform(cfg.seed, position))
    return sample(q, rng)


def make_rng(cfg: SamplingConfig, stream: int = 0) -> np.random.Generator:
    """A generator for one consumer (``stream`` 0 = verifier, 1 = drafter, ...)."""
    if cfg.seed is None:
        return np.random.default_rng()
    return np.random.default_rng([cfg.seed, stream])
