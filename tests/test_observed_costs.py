"""The sizing's curve learns what a verify costs in the engine (targets/cost.CostCurve.observe).

The measured curve counts as PRIOR_FORWARDS observations of each size; the engine's timed
verifies of n-node trees move the estimate for n toward them; no size reads cheaper than a
smaller one; one node keeps the measured figure (plain decoding, pipelined, is what drafting
competes with); one observation counts at most OBSERVED_CAP times the measured figure; nothing
moves with ``EDGESPEC_OBSERVED_COSTS=0`` (the suite's default). The engine observes a decoding's
own full forwards with a drafter, and not under rules (penalties, a grammar).
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
    """A chain whose nodes grow less likely: the measured curve verifies several of them; once
    the engine has seen those trees cost twice as much (the most an observation counts), the
    sizing verifies fewer."""
    c = _curve()
    probs = [0.6, 0.3, 0.15, 0.08, 0.04]
    assert best_budget(probs, c).nodes >= 3
    for n in range(2, 9):
        for _ in range(4 * PRIOR_FORWARDS):
            c.observe(n, cost.OBSERVED_CAP * c.ms(n))
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


def test_an_outlier_counts_at_most_the_cap(observing):
    """A verify timed during a pause of the process counts as OBSERVED_CAP times the measured
    figure, not as what the clock read."""
    c = _curve()
    c.observe(4, 1e6)
    assert c.ms_range(4, 1)[0] == pytest.approx(
        (PRIOR_FORWARDS * 7.0 + cost.OBSERVED_CAP * 7.0) / (PRIOR_FORWARDS + 1))


def test_steps_under_rules_are_not_observed(observing, target, monkeypatch):
    """Penalties (or a grammar) add their masking to a step's time: such steps would price the
    trees of every later request."""
    seen = []
    monkeypatch.setattr(cost, "_by_target", {target: _curve()})
    monkeypatch.setattr(CostCurve, "observe", lambda self, n, ms: seen.append(n))
    drafter = make_drafter(SpecConfig(method="lookup", num_draft=4), target, SamplingConfig())
    Engine(target, drafter).generate("the cat sat on the mat the cat sat on the mat",
                                     max_tokens=24,
                                     sampling=SamplingConfig(repetition_penalty=1.1))
    assert not seen
