"""Quantized self-draft and cascade drafting on tiny random models: exact output, oracles, costs.

Both methods only change what is proposed, so greedy output must equal plain decoding (their
sampling distribution: test_lossless.py). The cascade also has an inner boundary (lookup ->
draft model), checked on its own: its chain must follow the draft model.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from edgespec import Engine, SamplingConfig
from edgespec.drafters.draft_model import DraftModelDrafter
from edgespec.drafters.cascade import CascadeDrafter
from edgespec.drafters.quantized import QuantizedDrafter, make_quantized_draft
from edgespec.errors import ConfigError
from edgespec.sampling import probs


PROMPT = "the cat sat on the mat and then"
REPEAT = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"
SAMPLING = {"temperature": 1.0, "top_k": 6}
TARGET_KINDS = ("llama", "bias")  # conftest's `target`: these tests once per kind


@pytest.fixture(scope="module")
def sharp(tiny_models):
    """A target whose 4-bit copy and a random draft disagree with it often (rejections happen)."""
    return tiny_models.load(layers=4, scale=3.0)


def count_forwards(monkeypatch, model) -> dict:
    calls = {"n": 0}
    score = model.score

    def counted(*args, **kwargs):
        calls["n"] += 1
        return score(*args, **kwargs)

    monkeypatch.setattr(model, "score", counted)
    return calls


# --- quantized self-draft -------------------------------------------------------------------

@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_greedy_matches_plain(target, bits):
    plain = Engine(target).generate(PROMPT, max_tokens=32)
    drafter = QuantizedDrafter(target, bits, SamplingConfig(), num_draft=4)
    res = Engine(target, drafter).generate(PROMPT, max_tokens=32)
    assert res.token_ids == plain.token_ids
    assert res.stats.method == "quantized" and res.stats.proposed > 0
    assert 0.0 <= res.stats.acceptance_rate <= 1.0
    if bits == 8:
        assert res.stats.acceptance_rate > 0.5


def test_quantized_copy_is_made_once_per_target_and_setting(sharp):
    """A drafter per request (server, chat) reuses the quantized copy; outputs stay exact."""
    a, b = (QuantizedDrafter(sharp, 4, SamplingConfig()) for _ in range(2))
    assert a.draft is b.draft
    assert QuantizedDrafter(sharp, 8, SamplingConfig()).draft is not a.draft
    plain = Engine(sharp).generate(PROMPT, max_tokens=16).token_ids
    assert Engine(sharp, a).generate(PROMPT, max_tokens=16).token_ids == plain
    assert Engine(sharp, b).generate(PROMPT, max_tokens=16).token_ids == plain


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_quantized_greedy_with_rejections(sharp, bits):
    plain = Engine(sharp).generate(PROMPT, max_tokens=32)
    res = Engine(sharp, QuantizedDrafter(sharp, bits, SamplingConfig())).generate(PROMPT, max_tokens=32)
    assert res.token_ids == plain.token_ids
    assert res.stats.accepted < res.stats.proposed


def test_quantized_draft_is_quantized_and_close(sharp):
    q8 = make_quantized_draft(sharp, 8, group_size=32)
    assert q8.quantized and type(q8.model.model.layers[0].mlp.up_proj).__name__ == "QuantizedLinear"
    ids = Engine(sharp).encode(PROMPT)

    def argmax(m):
        cache = m.make_cache()
        logits = m.score(ids, cache).logits
        return np.array(logits).argmax(-1)

    assert (argmax(q8) == argmax(sharp)).mean() > 0.6
    assert not sharp.quantized  # the target itself is untouched


@pytest.mark.parametrize("bits", [0, 5, 16, "4", True])
def test_quantized_bad_bits(sharp, bits):
    with pytest.raises(ConfigError, match=repr(bits)):
        make_quantized_draft(sharp, bits)


def test_quantized_target_needs_fewer_bits(sharp):
    q4 = make_quantized_draft(sharp, 4)
    with pytest.raises(ConfigError, match="draft_bits 4 is not below the target's own 4-bit"):
        make_quantized_draft(q4, 4)
    q2 = make_quantized_draft(q4, 2)  # re-quantizing an already quantized target
    assert q2.model.model.layers[0].mlp.up_proj.bits == 2


def test_quantized_bad_group_size(sharp):
    with pytest.raises(ConfigError, match="group_size must be one of 32, 64, 128, got 48"):
        make_quantized_draft(sharp, 4, group_size=48)


# --- cascade --------------------------------------------------------------------------------

def test_cascade_self_draft_oracle(target):
    plain = Engine(target).generate(REPEAT, max_tokens=32)
    drafter = CascadeDrafter(target, SamplingConfig(), num_draft=4)
    res = Engine(target, drafter).generate(REPEAT, max_tokens=32)
    assert res.token_ids == plain.token_ids
    assert res.stats.method == "cascade" and res.stats.accepted == res.stats.proposed > 0


@pytest.mark.parametrize("prompt", [PROMPT, REPEAT])
def test_cascade_other_draft_greedy_matches_plain(sharp, other, prompt):
    plain = Engine(sharp).generate(prompt, max_tokens=40)
    drafter = CascadeDrafter(other, SamplingConfig(), num_draft=3)
    eng = Engine(sharp, drafter)
    res = eng.generate(prompt, max_tokens=40)
    assert res.token_ids == plain.token_ids
    assert res.stats.accepted < res.stats.proposed  # rejections were exercised
    # a second turn reuses the prefix; the inner index must have been rewound consistently
    again = eng.generate(prompt + plain.text[:10], max_tokens=20)
    assert again.token_ids == Engine(sharp).generate(prompt + plain.text[:10], max_tokens=20).token_ids


def test_cascade_chain_is_the_draft_models_greedy_chain(sharp, other):
    """The inner boundary: whatever lookup proposes, the chain is the draft model's own."""
    drafter = CascadeDrafter(other, SamplingConfig(), num_draft=6, max_draft=6, adaptive=False)
    ids = Engine(sharp).encode(REPEAT)
    drafter.prefill(ids, None, SamplingConfig())
    chain = drafter.propose(6).tokens[1:]
    plain = DraftModelDrafter(other, SamplingConfig(), num_draft=6, max_draft=6, adaptive=False)
    plain.prefill(ids, None, SamplingConfig())
    assert chain == plain.propose(6).tokens[1:]


def test_cascade_lookup_saves_draft_forwards(target, monkeypatch):
    counts = {}
    for name, make in (("draft", DraftModelDrafter), ("cascade", CascadeDrafter)):
        calls = count_forwards(monkeypatch, target)
        drafter = make(target, SamplingConfig(), num_draft=4, max_draft=4, adaptive=False)
        res = Engine(target, drafter).generate(REPEAT, max_tokens=40)
        counts[name] = calls["n"] - res.stats.target_forwards - 1  # minus the engine's own
        monkeypatch.undo()
    assert counts["cascade"] < 0.8 * counts["draft"], counts


# --- sampling -------------------------------------------------------------------------------

def test_cascade_sampled_chain_follows_the_draft(sharp, other):
    """The inner boundary under sampling: the first chain token is distributed as q (the
    draft's filtered distribution), although lookup proposed a fixed token, and q is attached."""
    ids = Engine(sharp).encode(REPEAT)
    cache = other.make_cache()
    logits = other.score(ids, cache).logits[-1]
    q = probs(np.array(logits)[None], SamplingConfig(**SAMPLING))[0]
    drafter = CascadeDrafter(other, SamplingConfig(**SAMPLING), num_draft=2, max_draft=2,
                             adaptive=False, vocab_size=sharp.args.vocab_size)
    counts = np.zeros(len(q))
    for seed in range(600):
        drafter.prefill(ids, None, SamplingConfig(**SAMPLING, seed=seed))
        tree = drafter.propose(2)
        np.testing.assert_allclose(tree.q[0], q, atol=1e-5)
        counts[tree.tokens[1]] += 1
    keep = q > 0
    assert counts[~keep].sum() == 0
    assert chisquare(counts[keep], q[keep] * counts.sum()).pvalue > 1e-3
