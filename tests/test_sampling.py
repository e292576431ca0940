"""sampling.py: the filters of ``probs`` in their documented order (temperature, top-k, top-p,
min-p), ties, drawing with ``sample``, and the seeded ``make_rng`` streams.

``reference_probs`` writes the documented rule out token by token; ``probs`` (vectorized) must
agree with it on random logits and configs, and on small examples worked by hand that would
come out differently under any other order of the filters.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import chisquare

from edgespec.config import SamplingConfig
from edgespec.sampling import make_rng, probs, sample


def reference_probs(logits, cfg: SamplingConfig) -> np.ndarray:
    """The documented rule for one row, one token at a time (ties: the lower id first)."""
    x = [float(v) for v in logits]
    V = len(x)
    if cfg.greedy:
        return np.eye(V)[x.index(max(x))]
    x = [v / cfg.temperature for v in x]
    keep = set(range(V))
    if cfg.top_k and cfg.top_k < V:
        kth = sorted(x, reverse=True)[cfg.top_k - 1]
        keep = {i for i in keep if x[i] >= kth}  # everything tied with the k-th stays
    top = max(x)
    w = {i: math.exp(x[i] - top) for i in keep}
    p = {i: w[i] / sum(w.values()) for i in keep}
    if cfg.top_p < 1.0:
        mass, nucleus = 0.0, set()
        for i in sorted(p, key=lambda i: (-p[i], i)):
            if mass >= cfg.top_p:
                break
            nucleus.add(i)
            mass += p[i]
        p = {i: p[i] for i in nucleus}
    if cfg.min_p > 0.0:
        floor = cfg.min_p * max(p.values())
        p = {i: v for i, v in p.items() if v >= floor}
    out = np.zeros(V)
    for i, v in p.items():
        out[i] = v / sum(p.values())
    return out


def dist(*weights) -> np.ndarray:
    """Logits whose softmax at temperature 1 is ``weights`` (normalized)."""
    return np.log(np.array(weights, dtype=np.float64))


def hot(**kw) -> SamplingConfig:
    return SamplingConfig(temperature=kw.pop("temperature", 1.0), **kw)


# --- probs ----------------------------------------------------------------------------------

def test_greedy_is_the_one_hot_argmax_and_ignores_the_filters():
    logits = dist(0.5, 0.2, 0.15, 0.1, 0.05)
    assert probs(logits, SamplingConfig()).tolist() == [1, 0, 0, 0, 0]
    assert probs(logits, SamplingConfig(top_k=3, top_p=0.1, min_p=0.5)).tolist() == [1, 0, 0, 0, 0]
    assert probs(np.array([1.0, 3.0, 3.0]), SamplingConfig()).tolist() == [0, 1, 0]  # tie: lower id


def test_each_filter_alone():
    logits = dist(0.5, 0.2, 0.15, 0.1, 0.05)
    np.testing.assert_allclose(probs(logits, hot()), np.exp(logits))
    np.testing.assert_allclose(probs(logits, hot(top_k=2)), [5 / 7, 2 / 7, 0, 0, 0])
    nucleus = [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0]  # 0.5 + 0.2 < 0.8: a third is needed
    np.testing.assert_allclose(probs(logits, hot(top_p=0.8)), nucleus)
    np.testing.assert_allclose(probs(logits, hot(min_p=0.3)), nucleus)  # keeps p >= 0.15
    np.testing.assert_allclose(probs(logits, hot(top_k=5)), np.exp(logits))  # k = V: off


@pytest.mark.parametrize("temperature, expected", [
    (1.0, [1 / 7, 2 / 7, 4 / 7]), (0.5, [1 / 21, 4 / 21, 16 / 21]),
    (2.0, np.array([1, 2 ** 0.5, 2]) / (3 + 2 ** 0.5)),
])
def test_temperature_divides_the_logits(temperature, expected):
    np.testing.assert_allclose(probs(dist(1, 2, 4), hot(temperature=temperature)), expected)


def test_temperature_comes_before_top_p():
    """At T=1 the 0.7-nucleus of (.5, .3, .2) is two tokens; at T=10 the distribution is
    nearly flat and needs all three (top-p applied before temperature would keep two)."""
    logits = dist(0.5, 0.3, 0.2)
    assert (probs(logits, hot(top_p=0.7)) > 0).sum() == 2
    assert (probs(logits, hot(temperature=10.0, top_p=0.7)) > 0).sum() == 3


def test_top_k_comes_before_top_p():
    """Top-2 of (.4, .3, .2, .1) renormalizes to (4/7, 3/7): its 0.5-nucleus is one token
    (top-p on the unfiltered distribution would keep two)."""
    logits = dist(0.4, 0.3, 0.2, 0.1)
    np.testing.assert_allclose(probs(logits, hot(top_p=0.5)), [4 / 7, 3 / 7, 0, 0])
    np.testing.assert_allclose(probs(logits, hot(top_k=2, top_p=0.5)), [1, 0, 0, 0])


def test_top_p_comes_before_min_p():
    """Nucleus 0.6 of (.5, .3, .2) is (.5, .3); min-p 0.5 then keeps both. In the other order
    min-p leaves (.625, .375), whose 0.6-nucleus is one token."""
    np.testing.assert_allclose(probs(dist(0.5, 0.3, 0.2), hot(top_p=0.6, min_p=0.5)), [0.625, 0.375, 0])


def test_top_p_keeps_the_smallest_set_that_reaches_it():
    logits = dist(0.5, 0.25, 0.125, 0.125)  # dyadic: the cumulative masses are exact
    assert (probs(logits, hot(top_p=0.75)) > 0).tolist() == [True, True, False, False]
    assert (probs(logits, hot(top_p=0.76)) > 0).tolist() == [True, True, True, False]
    assert (probs(logits, hot(top_p=1e-9)) > 0).sum() == 1  # the top token always survives


def test_ties():
    # top-k keeps every token tied with the k-th value (as HF's TopKLogitsWarper does)
    np.testing.assert_allclose(probs(np.array([1.0, 3.0, 3.0, 0.0]), hot(top_k=1)), [0, 0.5, 0.5, 0])
    # top-p breaks ties by token id, so p and q filtered alike keep the same tokens
    np.testing.assert_allclose(probs(np.zeros(4), hot(top_p=0.5)), [0.5, 0.5, 0, 0])
    # min-p keeps a token exactly at the floor
    np.testing.assert_allclose(probs(dist(0.5, 0.25, 0.25), hot(min_p=0.5)), [0.5, 0.25, 0.25])


def test_rows_are_independent_and_extremes_stay_finite():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (2, 3, 50))
    cfg = hot(temperature=0.7, top_k=10, top_p=0.9, min_p=0.02)
    batch = probs(logits, cfg)
    assert batch.shape == logits.shape and batch.dtype == np.float64
    for idx in np.ndindex(2, 3):
        np.testing.assert_array_equal(batch[idx], probs(logits[idx], cfg))
    extreme = probs(np.array([1e4, 9999.0, -1e30, -np.inf]), hot(temperature=0.01))
    assert np.isfinite(extreme).all() and extreme[0] == pytest.approx(1.0) and extreme[3] == 0


def random_config(rng) -> SamplingConfig:
    pick = rng.integers(0, 2, 4)
    return SamplingConfig(temperature=float(rng.choice([0.0, 0.3, 1.0, 2.5])) if pick[0] else 1.0,
                          top_k=int(rng.integers(1, 12)) if pick[1] else 0,
                          top_p=float(rng.uniform(0.05, 1.0)) if pick[2] else 1.0,
                          min_p=float(rng.uniform(0.0, 0.5)) if pick[3] else 0.0)


@pytest.mark.parametrize("seed", range(10))
def test_probs_matches_the_reference_on_random_inputs(seed):
    rng = np.random.default_rng(seed)
    for _ in range(30):
        V = int(rng.integers(2, 40))
        logits = rng.normal(0, float(rng.choice([0.5, 3.0])), V)
        if rng.random() < 0.3:  # repeated values: ties
            logits = np.round(logits)
        cfg = random_config(rng)
        p = probs(logits, cfg)
        np.testing.assert_allclose(p, reference_probs(logits, cfg), atol=1e-12, err_msg=str(cfg))
        assert p.sum() == pytest.approx(1.0) and (p >= 0).all()
        assert p[np.argmax(logits)] > 0  # the most likely token survives every filter


# --- sample ---------------------------------------------------------------------------------

class FixedUniform:
    """An rng whose ``random()`` returns the given numbers in turn."""

    def __init__(self, *u):
        self.u = list(u)

    def random(self):
        return self.u.pop(0)


@pytest.mark.parametrize("u, expected", [(0.0, 0), (0.1, 0), (0.25, 2), (0.45, 2), (0.75, 3),
                                         (0.99, 3), (0.999999, 3)])
def test_sample_inverts_the_cdf_and_skips_zero_mass(u, expected):
    p = np.array([0.25, 0.0, 0.5, 0.25, 0.0])  # cdf 0.25, 0.25, 0.75, 1, 1 (exact)
    assert sample(p, FixedUniform(u)) == expected
    assert sample(p * 8, FixedUniform(u)) == expected  # unnormalized weights are scaled


def test_sample_follows_the_distribution():
    rng = np.random.default_rng(0)
    p = np.array([0.1, 0.0, 0.6, 0.3, 0.0])
    draws = np.bincount([sample(p, rng) for _ in range(20000)], minlength=5)
    assert draws[1] == draws[4] == 0
    assert chisquare(draws[[0, 2, 3]], p[[0, 2, 3]] * 20000).pvalue > 1e-3


# --- make_rng -------------------------------------------------------------------------------

def test_seeded_streams_are_reproducible_and_distinct():
    first = {(s, k): tuple(make_rng(SamplingConfig(seed=s), k).random(3))
             for s, k in itertools.product(range(8), range(4))}
    assert len(set(first.values())) == len(first)  # no two (seed, stream) pairs share numbers
    assert tuple(make_rng(SamplingConfig(seed=3), 1).random(3)) == first[3, 1]
    unseeded = [make_rng(SamplingConfig(), 0).random() for _ in range(2)]
    assert unseeded[0] != unseeded[1]


def test_verifier_and_drafter_streams_are_independent():
    """Stream 0 (verifier) and stream 1 (drafter) of one seed: the joint histogram of paired
    draws is uniform over a 5 x 5 grid (a drafter's draws tell nothing about the verifier's)."""
    n = 20000
    a = make_rng(SamplingConfig(seed=11), 0).random(n)
    b = make_rng(SamplingConfig(seed=11), 1).random(n)
    cells = np.bincount((a * 5).astype(int) * 5 + (b * 5).astype(int), minlength=25)
    assert chisquare(cells).pvalue > 1e-3
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.03
