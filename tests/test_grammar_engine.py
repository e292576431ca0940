"""Speculation under a grammar stays lossless: greedy output equals constrained plain decoding with
every drafter (and parses and validates), sampled output follows the constrained distribution,
and a grammar rule that masks every node from the committed tokens alone fails that check."""

from __future__ import annotations

import json

import jsonschema
import mlx.core as mx
import pytest

from edgespec import Engine, SamplingConfig
from edgespec.grammar import Grammar, GrammarRule

from .test_lossless import ALPHA, CFG, DRAFTERS
from .test_rules import exact_ruled_joint, ruled_pvalue, setup  # noqa: F401 (fixture)

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 3},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "pet": {"enum": ["cat", "dog"]},
    },
    "required": ["name", "n", "pet"],
}
PAIRS = Grammar("regex", "([^E]|E[^J])*")  # after "E", "J" is forbidden: the path matters


def _json_rule(target):
    return GrammarRule(Grammar.json_schema(SCHEMA), target.tokenizer)


@pytest.mark.parametrize("method", list(DRAFTERS))
def test_greedy_json_equals_constrained_plain_decoding(setup, method):
    target, draft, ids = setup
    want = Engine(target).generate(ids, max_tokens=64, rules=_json_rule(target))
    engine = Engine(target, DRAFTERS[method](target, draft, SamplingConfig()))
    got = engine.generate(ids, max_tokens=64, rules=_json_rule(target))
    assert got.token_ids == want.token_ids
    assert got.finish_reason == want.finish_reason == "stop"
    jsonschema.validate(json.loads(got.text), SCHEMA)
    if method != "none":  # keys and punctuation were drafted for free and accepted
        assert got.stats.accepted + got.stats.forced > 0
        assert got.stats.target_forwards < want.stats.target_forwards


@pytest.mark.parametrize("method", ["draft", "lookup"])
def test_forced_tokens_are_counted_apart_from_the_drafters(setup, method):
    target, draft, ids = setup
    drafter = DRAFTERS[method](target, draft, SamplingConfig())
    own = []  # every node the drafter proposed
    propose = drafter.propose
    drafter.propose = lambda budget: own.append(t := propose(budget)) or t
    stats = Engine(target, drafter).generate(ids, max_tokens=64, rules=_json_rule(target)).stats
    assert stats.forced > 0  # keys and punctuation
    assert stats.proposed == sum(t.num_drafted for t in own)  # the drafter's, cut ones too
    assert stats.accepted <= stats.proposed
    assert stats.as_dict()["forced"] == stats.forced


class CommittedOnly(GrammarRule):
    """Wrong: every node's row masked from the committed tokens alone, its drafted path ignored."""

    def apply(self, tree, logits):
        root = super().apply(type(tree).chain(tree.tokens[0], []), logits[:1])
        return mx.where(root > -mx.inf, logits, -mx.inf)

    def commit(self, tokens):  # what it let through is off the grammar: stop following there
        for t in tokens:
            if int(t) in self.eos or self._m.try_consume_tokens([int(t)]) != 1:
                return


@pytest.mark.parametrize("method", ["draft", "lookup", "eagle3", "medusa"])
def test_sampling_follows_the_constrained_target(setup, method):
    target, draft, ids = setup
    cfg = SamplingConfig(**CFG)
    exact = exact_ruled_joint(target, ids, cfg, lambda: GrammarRule(PAIRS, target.tokenizer))
    engine = Engine(target, DRAFTERS[method](target, draft, cfg), cfg)
    pvalue, accepted = ruled_pvalue(engine, ids, cfg,
                                    lambda: GrammarRule(PAIRS, target.tokenizer), exact)
    assert pvalue > ALPHA, pvalue
    assert accepted > 0


def test_the_check_rejects_a_rule_that_ignores_the_path(setup):
    target, draft, ids = setup
    cfg = SamplingConfig(**CFG)
    exact = exact_ruled_joint(target, ids, cfg, lambda: GrammarRule(PAIRS, target.tokenizer))
    engine = Engine(target, DRAFTERS["draft"](target, draft, cfg), cfg)
    pvalue, _ = ruled_pvalue(engine, ids, cfg, lambda: CommittedOnly(PAIRS, target.tokenizer),
                             exact)
    assert pvalue < ALPHA / 100, pvalue
