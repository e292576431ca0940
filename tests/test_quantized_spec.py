"""Speculation on a 4-bit target (a tiny model kept quantized, as ``--dtype auto`` keeps a GGUF):
every drafter the quantized path uses keeps greedy output identical to plain decoding, and the
tree sizing reads the quantized target's own cost curve."""

from __future__ import annotations

import pytest

from edgespec import Engine
from edgespec.drafters.auto import AutoDrafter
from edgespec.drafters.eagle3 import Eagle3Drafter
from edgespec.drafters.lookup import PromptLookupDrafter
from edgespec.heads.eagle3 import quantized_head
from edgespec.targets.cost import CostCurve, curve_key
from edgespec.targets.load import load_target

from .test_eagle3 import OracleHead, random_head
from .test_qmatmul import _quantized_copy

PROMPTS = ["the cat sat on the mat and the cat sat on the", "one two three four one two three"]
# a curve that rises with the node count, as a quantized CPU target's does
STEEP = CostCurve((1, 2, 4, 8, 16), (1.0, 1.3, 1.9, 3.0, 5.5))


@pytest.fixture(scope="module")
def q4(tiny_models, tmp_path_factory):
    path = _quantized_copy(tiny_models.path(layers=2), tmp_path_factory.mktemp("q4") / "m")
    target = load_target(path, dtype="auto")
    assert target.quantized
    return target


def _plain(target, prompt, n=24):
    return Engine(target).generate(prompt, max_tokens=n).token_ids


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_head_on_a_4bit_target_keeps_greedy_output(q4, bits):
    head = quantized_head(random_head(q4, seed=3), bits)
    for prompt in PROMPTS:
        drafter = Eagle3Drafter(q4, head, STEEP, lookup=PromptLookupDrafter())
        res = Engine(q4, drafter).generate(prompt, max_tokens=24)
        assert res.token_ids == _plain(q4, prompt)
        assert res.stats.proposed > 0


def test_an_oracle_head_on_a_4bit_target_is_accepted(q4):
    """Multi-node verifies on the quantized target: a head that knows the greedy continuation
    has its chains accepted (24 tokens in at most 6 forwards of 4 drafted nodes and the root's
    token), and the output is plain decoding's."""
    prompt = PROMPTS[0]
    plain = Engine(q4).generate(prompt, max_tokens=24)
    ids = Engine(q4).encode(prompt)
    drafter = Eagle3Drafter(q4, OracleHead(q4, ids + plain.token_ids), None, nodes=4)
    res = Engine(q4, drafter).generate(prompt, max_tokens=24)
    assert res.token_ids == plain.token_ids
    assert res.stats.target_forwards <= 6


def test_auto_on_a_4bit_target_keeps_greedy_output(q4):
    head = quantized_head(random_head(q4, seed=4), 8)
    for prompt in PROMPTS:
        auto = AutoDrafter({"none": None, "lookup": PromptLookupDrafter(),
                            "eagle3": Eagle3Drafter(q4, head, STEEP)})
        res = Engine(q4, auto).generate(prompt, max_tokens=24)
        assert res.token_ids == _plain(q4, prompt)
        assert sum(r["steps"] + r["sure_steps"] for r in auto.report().values()) > 0


def test_the_quantized_target_has_its_own_cost_curve(q4, tiny_models):
    """The tree sizing of a 4-bit target reads a curve measured on the 4-bit target, never its
    float twin's (the key covers the quantization)."""
    assert curve_key(q4) != curve_key(tiny_models.load(layers=2))


def test_symmetric_weights_decode_as_when_their_biases_are_read(tiny_models, tmp_path,
                                                                 monkeypatch):
    """An 8-bit copy whose biases are -128 times their scales (GGUF's Q8_0): every block and
    the LM head are found symmetric, so the int8 kernel makes the biases from the scales; the
    logits and the greedy output (plain and speculative) are those of the same model with the
    biases read."""
    import mlx.core as mx

    from edgespec.kernels import fused_block, matmul
    from edgespec.kernels.native import load as native_load

    if native_load() is None or not native_load().q8_vnni():
        pytest.skip("the biases are made from the scales by the AVX-512 VNNI form only")
    path = _quantized_copy(tiny_models.path(layers=2), tmp_path / "q8", bits=8, symmetric=True)
    made = load_target(path, dtype="auto")
    assert all(q[2] == 1 for b in made.model.model.layers for q in b._fused.native_shape[-1])
    with monkeypatch.context() as m:
        m.setattr(fused_block, "symmetric_biases", lambda *a: False)
        m.setattr(matmul, "symmetric_biases", lambda *a: False)
        read = load_target(path, dtype="auto")
        assert all(q[2] == 0 for b in read.model.model.layers for q in b._fused.native_shape[-1])
        prompt = PROMPTS[0]
        ids = Engine(read).encode(prompt)
        want_logits = read.score(ids, read.make_cache()).logits
        want_plain = _plain(read, prompt)
        mx.eval(want_logits)
    got_logits = made.score(ids, made.make_cache()).logits
    assert mx.array_equal(got_logits, want_logits).item()
    assert _plain(made, prompt) == want_plain
    drafter = Eagle3Drafter(made, random_head(made, seed=5), STEEP, lookup=PromptLookupDrafter())
    assert Engine(made, drafter).generate(prompt, max_tokens=24).token_ids == want_plain
