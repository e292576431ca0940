"""The verify-cost curve (measured once per device and model shape, cached under $EDGESPEC_CACHE)
and the node budget chosen from it; the calibration that turns draft confidence into acceptance."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

from edgespec.drafters.confidence import Calibration, best_first, choose, path_probs, top_k
from edgespec.targets import cost
from edgespec.targets.cost import CostCurve, best_budget, measure_cost_curve, verify_cost_curve
from edgespec.tree import DraftTree

CPU_LIKE = CostCurve((1, 2, 4, 8, 16), (20.0, 24.0, 30.0, 44.0, 80.0))  # 8 nodes: 2.2x one


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(cost, "_memo", {})
    monkeypatch.setattr(cost, "_by_target", weakref.WeakKeyDictionary())
    return tmp_path


def test_interpolation_and_extension():
    assert CPU_LIKE.ms(1) == 20.0 and CPU_LIKE.ms(4) == 30.0
    assert CPU_LIKE.ms(3) == pytest.approx(27.0)
    assert CPU_LIKE.ms(24) == pytest.approx(80.0 + 8 * (36.0 / 8))  # the last slope, extended
    assert CostCurve.from_json(CPU_LIKE.to_json()) == CPU_LIKE


def test_measured_once_then_read_from_the_cache(target, fresh_cache):
    calls = []

    def measure(t):
        calls.append(t)
        return measure_cost_curve(t, sizes=(1, 2, 4), context=16, repeats=1)

    curve = verify_cost_curve(target, measure)
    files = list((fresh_cache / "cost").glob("*.json"))
    assert len(calls) == 1 and len(files) == 1 and curve.key in files[0].name
    assert curve.sizes == (1, 2, 4) and all(ms > 0 for ms in curve.times)
    assert verify_cost_curve(target, measure) is curve  # memoized in the process
    cost._memo.clear()
    again = verify_cost_curve(target, measure)  # a new process: read from the file
    assert len(calls) == 1 and again == curve
    files[0].write_text("not json")
    cost._memo.clear()
    verify_cost_curve(target, measure)  # a damaged file is measured again
    assert len(calls) == 2


def test_the_key_follows_shape_not_weights(tiny_models):
    a, b = tiny_models.load(seed=1), tiny_models.load(seed=2)
    wider = tiny_models.load(hidden=32)
    assert cost.curve_key(a) == cost.curve_key(b) != cost.curve_key(wider)


def test_budget_grows_as_verifying_gets_cheaper():
    probs = [0.9, 0.8, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05]
    steep = best_budget(probs, CPU_LIKE)
    flat = best_budget(probs, CostCurve((1, 64), (20.0, 20.0)))
    assert flat.nodes == len(probs)  # free nodes: take every one with any chance
    assert 0 < steep.nodes < flat.nodes
    # the choice is the best of all prefixes
    rates = [(1 + sum(probs[:n])) / CPU_LIKE.ms(n + 1) for n in range(len(probs) + 1)]
    assert steep.nodes == int(np.argmax(rates)) and steep.rate == pytest.approx(max(rates))


def test_hopeless_drafts_mean_plain_decoding():
    assert best_budget([0.01, 0.01], CPU_LIKE).nodes == 0
    assert best_budget([], CPU_LIKE).nodes == 0
    assert best_budget([0.99] * 40, CPU_LIKE, limit=5).nodes <= 5


def test_draft_time_is_in_the_denominator():
    probs = [0.3, 0.2, 0.1]
    for draft_ms in (0.0, 5.0, 40.0):
        rates = [(1 + sum(probs[:n])) / (draft_ms + CPU_LIKE.ms(n + 1)) for n in range(4)]
        b = best_budget(probs, CPU_LIKE, draft_ms=draft_ms)
        assert b.nodes == int(np.argmax(rates)) and b.rate == pytest.approx(max(rates))
    assert best_budget(probs, CPU_LIKE).nodes < best_budget(probs, CPU_LIKE, draft_ms=40.0).nodes


def test_calibration_learns_acceptance_per_bucket():
    cal = Calibration(prior=2.0, decay=1.0)
    assert cal(0.95) == pytest.approx(0.95)  # the prior trusts the head
    for _ in range(200):  # a head that is 95% sure and right 30% of the time
        cal.observe([0.95] * 10, [True] * 3 + [False] * 7)
    assert cal(0.95) == pytest.approx(0.3, abs=0.01)
    assert cal(0.15) == pytest.approx(0.15)  # other buckets untouched


def test_path_probabilities_and_an_ancestor_closed_cut():
    parents = [-1, 0, 0, 1, 1, 3]
    edge = np.array([1.0, 0.9, 0.5, 0.5, 0.6, 1.0])
    p = path_probs(parents, edge)
    assert p.tolist() == pytest.approx([1.0, 0.9, 0.5, 0.45, 0.54, 0.45])
    order = best_first(p)
    assert order.tolist() == [1, 4, 2, 3, 5]  # node 5 (= its parent's probability) after it
    for n in range(1, 6):
        kept = set(order[:n].tolist()) | {0}
        assert all(parents[u] in kept for u in kept if u)
    keep, budget = choose(parents, edge, Calibration(prior=1e9), CPU_LIKE, 0.0, None, 63)
    assert budget is not None and keep.tolist() == order[: budget.nodes].tolist()
    keep, budget = choose(parents, edge, Calibration(), None, 0.0, 3, 63)
    assert budget is None and keep.tolist() == order[:3].tolist()


def test_top_k_is_a_stable_sort_cut_short():
    """The head's children on the host: each row's k best columns, best first, the lower column
    first among equals: what a stable sort gives, also with ties, -inf and k past the row."""
    rng = np.random.default_rng(1)
    for _ in range(500):
        rows, cols, k = rng.integers(1, 5), rng.integers(1, 40), rng.integers(1, 6)
        lg = rng.integers(-3, 3, (rows, cols)).astype(np.float32)  # many ties
        if rng.random() < 0.3:
            lg[rng.random(lg.shape) < 0.6] = -np.inf
        want = np.argsort(-lg, axis=-1, kind="stable")[:, :k]
        np.testing.assert_array_equal(top_k(lg, k), want)
    lg = rng.standard_normal((4, 8192)).astype(np.float32)
    np.testing.assert_array_equal(top_k(lg, 4), np.argsort(-lg, axis=-1)[:, :4])


def test_measured_in_interleaved_rounds_and_never_cheaper_for_more_nodes(target):
    """Sizes are visited in turn, round after round (a slow spell hits all alike), and a size
    measured slower than a larger one (here: every 1-node forward made 40 ms slower) takes the
    larger one's time."""
    import time

    seen = []

    class Slow1:
        def __getattr__(self, name):
            return getattr(target, name)

        def score(self, tree, cache, **kw):
            if isinstance(tree, DraftTree):
                seen.append(len(tree.tokens))
                if len(tree.tokens) == 1:
                    time.sleep(0.04)
            return target.score(tree, cache, **kw)

    curve = measure_cost_curve(Slow1(), sizes=(1, 2, 4), context=16, repeats=2)
    assert seen == [1, 2, 4] + [1, 1, 2, 2, 4, 4] * 2  # a warm-up round, then two of pairs
    assert curve.times[0] <= curve.times[1] <= curve.times[2] < 40.0
    assert cost.monotone([38.0, 18.0, 20.0, 19.0, 21.0, 30.0]) == (18.0, 18.0, 19.0, 19.0, 21.0, 30.0)


def test_a_measurement_reports_its_progress_as_lines_within_reporting(target):
    """Besides its tqdm bar (stderr, which the chat's screen hides), a measurement inside
    ``reporting`` calls the given function after every forward; outside it, nothing is called."""
    lines = []
    with cost.reporting(lines.append):
        measure_cost_curve(target, sizes=(1, 2, 4), context=16, repeats=1)
    total = 3 * (1 + 2 * 1)
    assert len(lines) == total and lines[-1].endswith(f"{total}/{total} forwards")
    assert "verify cost" in lines[0] and lines[0].endswith(f"1/{total} forwards")
    measure_cost_curve(target, sizes=(1, 2), context=16, repeats=1)
    assert len(lines) == total
