"""The sizing's curve learns what a verify costs in the engine (targets/cost.CostCurve.observe).

The measured curve counts as PRIOR_FORWARDS observations of each size; the engine's timed
verifies of n-node trees move the estimate for n toward them; no size reads cheaper than a
smaller one; one node keeps the measured figure (plain decoding, pipelined, is what drafting
competes with); nothing moves with ``EDGESPEC_OBSERVED_COSTS=0`` (the suite's default). The
engine observes a decoding's own full forwards, and only with a drafter that sizes on a curve.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgespec import Engine
from edgespec.config import SamplingConfig, SpecConfig
from edgespec.drafters import make_drafter
from edgespec.targets import cost
from edgespec.targets.cost import PRIOR_FORWARDS, CostCurve, best_budget


@pytest.fixture
def observing(monkeypatch):
    monkeypatch.setenv("EDGESPEC_OBSERVED_COSTS", "1")


def _curve():
    return CostCurve((1, 2, 4, 8, 16), (6.0, 6.5, 7.0, 8.0, 12.0))


def test_observations_move_the_estimate_by_their_weight(observing):
    c = _curve()
    before = c.ms_range(1, 8).copy()
    np.testing.assert_array_equal(before, c.measured[1:9])
    for _ in range(PRIOR_FORWARDS):
        c.observe(4, 11.0)
    t = c.ms_range(1, 8)
    assert t[0] == 6.0  # one node: the measured figure
    assert t[3] == pytest.approx((PRIOR_FORWARDS * 7.0 + PRIOR_FORWARDS * 11.0) / (2 * PRIOR_FORWARDS))
    assert t[4] >= t[3] and np.all(np.diff(c.table) >= 0)  # no size cheaper than a smaller one
    assert c.ms(4) == 7.0  # the measured curve itself is kept (doctor, the ratios)


def test_what_is_not_observed(observing):
    c = _curve()
    for n, ms in ((1, 50.0), (0, 50.0), (2 * cost.MAX_NODES + 1, 50.0), (3, 0.0), (3, -1.0)):
        c.observe(n, ms)
    np.testing.assert_array_equal(c.table, c.measured)


def test_off_by_setting(monkeypatch):
    monkeypatch.setenv("EDGESPEC_OBSERVED_COSTS", "0")
    c = _curve()
    c.observe(4, 100.0)
    np.testing.assert_array_equal(c.table, c.measured)


def test_dearer_verifies_shrink_the_tree(observing):
    """Nodes each likely to be accepted: the measured curve verifies several; once the engine
    has seen those trees cost far more, the sizing verifies fewer."""
    c = _curve()
    probs = [0.6] * 7
    assert best_budget(probs, c).nodes >= 3
    for n in range(2, 9):
        for _ in range(4 * PRIOR_FORWARDS):
            c.observe(n, 6.0 + 8.0 * (n - 1))
    assert best_budget(probs, c).nodes < 3


def test_the_engine_observes_its_verifies(observing, target, monkeypatch):
    seen = []
    curve = _curve()
    monkeypatch.setattr(cost, "_by_target", {target: curve})
    monkeypatch.setattr(CostCurve, "observe", lambda self, n, ms: seen.append((self, n, ms)))
    drafter = make_drafter(SpecConfig(method="lookup", num_draft=4), target, SamplingConfig())
    Engine(target, drafter).generate("the cat sat on the mat the cat sat on the mat",
                                     max_tokens=24)
    assert seen and all(c is curve and n >= 2 and ms > 0 for c, n, ms in seen)
    seen.clear()
    Engine(target, None).generate("the cat sat on the mat", max_tokens=8)  # no drafter
    assert not seen
