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
