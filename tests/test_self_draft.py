"""Early-exit and layer-skip self-drafts on tiny random models: oracle, exactness, calibration
(and its pure decision rule). Their sampling distribution: test_lossless.py."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec import Engine, SamplingConfig
from edgespec.drafters.calibrate import (
    calibrate_exit_layer, calibration_ids, choose_best, expected_speedup, search_layer_subset, simulate_tau,
)
from edgespec.drafters.early_exit import EarlyExitDrafter
from edgespec.drafters.layer_skip import LayerSkipDrafter
from edgespec.drafters.layer_subset import LayerSubset
from edgespec.errors import ConfigError
from edgespec.targets.decoder import Decoder

from .tiny import KINDS

PROMPT = "the cat sat on the mat and then"
TARGET_KINDS, TARGET_LAYERS = tuple(KINDS), 4  # conftest's `target`: 4 layers, once per kind
GREEDY = SamplingConfig()


@pytest.fixture(scope="module")
def near_identity(tiny_models):
    """Layers that barely change the residual stream: shallow drafts agree with the target."""
    return tiny_models.load(layers=8, scale=0.05)


def drafters(target, sampling=GREEDY, k=3, adaptive=True):
    """One shallow early exit and one skipped-middle subset (with confidence stopping)."""
    return [EarlyExitDrafter(target, sampling, exit_layer=2, num_draft=k, adaptive=adaptive),
            LayerSkipDrafter(target, sampling, layers=[0, 2, 3], num_draft=k, confidence=0.6)]


@pytest.mark.parametrize("k", [1, 3])
def test_all_layers_is_the_self_draft_oracle(target, k):
    plain = Engine(target).generate(PROMPT, max_tokens=24)
    L = target.num_layers
    for d in (EarlyExitDrafter(target, GREEDY, exit_layer=L, num_draft=k, max_draft=k, adaptive=False),
              LayerSkipDrafter(target, GREEDY, layers=range(L), num_draft=k, max_draft=k,
                               confidence=0.0, adaptive=False)):
        res = Engine(target, d).generate(PROMPT, max_tokens=24)
        assert res.token_ids == plain.token_ids
        assert res.stats.acceptance_rate == 1.0
        assert all(s.proposed == k for s in res.steps[:-1])
        assert res.stats.target_forwards == -(-24 // (k + 1))  # tau = k + 1


def test_subsets_keep_greedy_output_across_turns(target):
    turns = [[{"role": "user", "content": "hello there"}]]
    plain_eng = Engine(target)
    first = plain_eng.generate(turns[0], max_tokens=12).text
    turns.append(turns[0] + [{"role": "assistant", "content": first},
                             {"role": "user", "content": "and then?"}])
    want = [Engine(target).generate(t, max_tokens=12).token_ids for t in turns]
    for d in drafters(target):
        eng = Engine(target, d)
        assert eng.generate(turns[0], max_tokens=12).token_ids == want[0]
        cache = d.cache
        assert eng.generate(turns[1], max_tokens=12).token_ids == want[1]
        assert eng.last_stats.cached_tokens > 0
        assert d.cache is cache  # the drafter kept its prefix too (a reset makes a new cache)


def test_window_rollover_with_skipped_layers(tiny_models):
    """Past the point where the draft's sliding-window cache compacts every slot it has."""
    target = tiny_models.load(layers=4, window=8)
    prompt = PROMPT * 16  # ~400 tokens: the drafter's cache compacts during the first steps
    want = Engine(target).generate(prompt, max_tokens=12).token_ids
    for d in drafters(target):
        assert Engine(target, d).generate(prompt, max_tokens=12).token_ids == want
        cache = d.lower.cache if isinstance(d, EarlyExitDrafter) else d.cache
        assert cache.start > 0  # it did compact


def test_early_exit_verifies_only_the_upper_layers(target, monkeypatch):
    """With the engine's shared cache the draft's layers < E are not recomputed: each step
    runs layers < E once per tree node (drafting), layers >= E once per step (verifying)."""
    E, L = 2, target.num_layers
    calls = [0] * L
    blocks = target.model.model.layers
    originals = [type(b).__call__ for b in blocks]
    assert len(set(originals)) == 1

    def counting(self, x, positions, mask, cache, layer):
        calls[next(i for i, b in enumerate(blocks) if b is self)] += x.shape[1]  # token-layers
        return originals[0](self, x, positions, mask, cache, layer)

    d = EarlyExitDrafter(target, GREEDY, exit_layer=E, num_draft=3)
    eng = Engine(target, d)
    ids = eng.encode(PROMPT)
    monkeypatch.setattr(type(blocks[0]), "__call__", counting)
    monkeypatch.setattr(Decoder, "_stack_for", lambda *a: None)  # every layer through __call__
    res = eng.generate(PROMPT, max_tokens=16)
    monkeypatch.undo()
    assert res.token_ids == Engine(target).generate(PROMPT, max_tokens=16).token_ids
    prefill = len(ids) - 1
    nodes = sum(s.proposed + 1 for s in res.steps)  # tree nodes scored, root included
    assert calls[E:] == [prefill + nodes] * (L - E)  # prefill + one verification per step
    assert calls[:E] == [prefill + nodes] * E  # prefill + each node fed once by the draft
    assert d.cache.offset == 0  # the drafter's own cache was never used


def test_confidence_ends_the_chain(target):
    """Every draft but the last is confident; the last is not, or the chain is at max_draft."""
    layers, cap, threshold = [0, 1, 3], 6, 0.9999
    ids = Engine(target).encode(PROMPT * 2)
    lengths = []
    for n in range(4, len(ids), 3):
        d = LayerSkipDrafter(target, GREEDY, layers=layers, max_draft=cap, confidence=threshold)
        d.prefill(ids[:n], None, GREEDY)
        drafts = d.propose(cap).tokens[1:]
        sub = LayerSubset(target, layers)
        seq, c = ids[:n] + drafts, sub.make_cache()
        logits = sub.score(seq, c).logits
        rows = mx.softmax(logits[n - 1 : n - 1 + len(drafts)], axis=-1)
        assert drafts == np.array(mx.argmax(rows, axis=-1)).tolist()
        top = np.array(mx.max(rows, axis=-1))
        assert (top[:-1] >= threshold - 1e-4).all()
        assert len(drafts) == cap or top[-1] < threshold + 1e-4
        lengths.append(len(drafts))
    assert min(lengths) < cap  # the rule did end some chains early


def test_bad_layers_are_rejected(target):
    with pytest.raises(ConfigError, match="exit_layer"):
        EarlyExitDrafter(target, GREEDY, exit_layer=0)
    with pytest.raises(ConfigError, match="layers"):
        LayerSubset(target, [2, 1])
    with pytest.raises(ConfigError, match="layers"):
        LayerSubset(target, [0, target.num_layers])


def test_simulate_tau():
    assert simulate_tau([True] * 10, 4) == 10 / 2
    assert simulate_tau([False] * 6, 4) == 1.0
    # steps: 3 accepted + bonus (t=0..3), mismatch (t=4), 1 accepted + bonus (t=5,6)
    assert simulate_tau([True, True, True, False, False, True, False], 4) == 7 / 3


def test_decision_refuses_what_cannot_pay():
    # drafts half as costly as the target and rarely right: slower than plain decoding
    slow = expected_speedup(tau=1.2, k=4, draft_cost=0.5, verify_cost=1.1, plain_cost=1.0)
    fast = expected_speedup(tau=4.5, k=4, draft_cost=0.1, verify_cost=1.1, plain_cost=1.0)
    assert slow < 1 < fast
    row = dict(accepted=0.1, tau=1.2, speedup=slow, exit_layer=3)
    best, reason = choose_best([row], "exit_layer")
    assert best is None and "plain decoding" in reason
    good = dict(row, exit_layer=1, tau=4.5, accepted=0.9, speedup=fast)
    best, _ = choose_best([row, good], "exit_layer")
    assert best == 1


def test_calibration_measures_every_exit_and_decides_by_its_table(near_identity):
    """Near-identity layers: every exit's drafts are accepted, and the choice is the table's
    fastest row or none (whether drafting pays depends on this machine's timings, which a unit
    test does not assert; the bench measures them)."""
    res = calibrate_exit_layer(near_identity, calibration_ids(near_identity), tokens=16)
    assert [r["exit_layer"] for r in res.table] == list(range(1, 8))
    for r in res.table:
        assert 0.0 <= r["accepted"] <= 1.0 and 1.0 <= r["tau"] <= 5.0 and r["draft_ms"] > 0
    assert min(r["accepted"] for r in res.table[:4]) > 0.8  # near-identity layers barely matter
    assert (res.best, res.reason) == choose_best(res.table, "exit_layer")


def test_layer_search_drops_layers_on_near_identity(near_identity):
    ids = near_identity.tokenizer.encode(PROMPT)
    res = search_layer_subset(near_identity, ids, tokens=16, max_forwards=9)
    assert 1 <= len(res.table) <= 3  # three rounds of beam 3: bounded
    sizes = [len(r["layers"]) for r in res.table]
    assert sizes == list(range(7, 7 - len(sizes), -1))  # one layer dropped per round
    assert all(r["layers"][0] == 0 and r["layers"][-1] == 7 for r in res.table)
    assert min(r["accepted"] for r in res.table) > 0.8  # near-identity layers barely matter
    assert res.best == choose_best(res.table, "layers")[0]
    # whatever it picks stays exact
    d = LayerSkipDrafter(near_identity, GREEDY, layers=res.table[-1]["layers"])
    assert Engine(near_identity, d).generate(PROMPT, max_tokens=16).token_ids == \
        Engine(near_identity).generate(PROMPT, max_tokens=16).token_ids
