"""Predicted outputs: the prediction drafter aligns with the answer, re-aligns after each
insertion, deletion and edit, and stays lossless (greedy output equals plain decoding)."""

from __future__ import annotations

import random

import pytest

from edgespec.config import SpecConfig
from edgespec.drafters import make_drafter
from edgespec.drafters.lookup import PromptLookupDrafter
from edgespec.drafters.prediction import PredictionDrafter, PredictionIndex
from edgespec.engine import Engine
from edgespec.verify import Accepted


def replay(drafter, prompt: list[int], answer: list[int]) -> tuple[int, int, int]:
    """Run ``drafter`` against a target that greedily produces ``answer``: (target forwards,
    accepted prediction tokens, rejected prediction tokens)."""
    drafter.prefill(prompt, None)
    done = forwards = 0
    while done < len(answer):
        tree = drafter.propose(len(answer) - done - 1)
        assert tree.is_chain and tree.tokens[0] == (prompt + answer)[len(prompt) + done - 1]
        path, u = [0], 0
        while tree.children(u) and tree.tokens[tree.children(u)[0]] == answer[done + len(path) - 1]:
            u = tree.children(u)[0]
            path.append(u)
        acc = Accepted(path, answer[done : done + len(path)])
        drafter.update(acc, tree, None)
        done += len(acc.tokens)
        forwards += 1
    return (forwards, *drafter.prediction_tokens())


_rng = random.Random(0)
FILE = [_rng.randrange(50, 500) for _ in range(400)]  # a "file": its n-grams mostly unique


def edited(tokens, at, delete=0, insert=()):
    return tokens[:at] + list(insert) + tokens[at + delete :]


@pytest.mark.parametrize("answer", [
    FILE,  # unchanged
    edited(FILE, 150, insert=[7, 8, 9, 10, 11]),  # an insertion
    edited(FILE, 150, delete=30),  # a deletion
    edited(FILE, 150, delete=6, insert=[7, 8, 9]),  # an edit
    edited(edited(FILE, 300, delete=10), 100, delete=2, insert=[7, 8, 9, 10]),  # two edits
], ids=["same", "insert", "delete", "edit", "two-edits"])
def test_realigns_after_each_divergence(answer):
    forwards, kept, rejected = replay(PredictionDrafter(FILE), [1, 2, 3], answer)
    assert kept >= len(answer) - 30  # all but the changed region and a few tokens around it
    assert forwards * 15 <= len(answer)  # long chains: ~400 tokens in some twenty forwards
    assert rejected <= 64 * 3  # at most a few long chains past a divergence


def test_index_prefers_the_nearest_match_at_or_after_the_mark():
    index = PredictionIndex([5, 6, 1, 2, 5, 6, 3, 4, 5, 6, 7], hi=4)
    assert index.find([9, 5, 6], near=0, reach=4) == (2, 2)
    assert index.find([9, 5, 6], near=3, reach=4) == (2, 6)
    assert index.find([9, 5, 6], near=11, reach=4) == (2, 10)  # none after: the nearest before
    assert index.find([4, 5, 6], near=0, reach=4) == (3, 10)  # the longest match wins
    assert index.find([42], near=0, reach=4) is None
    assert index.find([9, 7], near=5, reach=6) == (1, 11)  # one token: only within reach
    assert index.find([9, 7], near=4, reach=6) is None
    assert index.find([9, 3], near=8, reach=6) is None  # ... and never behind


def test_without_a_match_the_inner_drafter_proposes():
    inner = PromptLookupDrafter()
    d = PredictionDrafter([100, 101, 102, 103], inner)
    d.MIN_MATCH = 1  # (the default asks for 2 tokens: here one token re-aligns until a miss)
    d.prefill([1, 2, 3, 1, 2], None)
    tree = d.propose(8)
    assert tree.tokens[1:] == [100, 101, 102, 103] and tree.source[1] == "prediction"
    d.update(Accepted([0], [3]), tree, None)  # the answer starts elsewhere: lost
    assert d.prediction_tokens() == (0, 4)
    tree = d.propose(8)
    assert tree.source is None and tree.tokens[1] == 1  # lookup: "2 3" was followed by 1
    d.update(Accepted([0, 1], [1, 100]), tree, None)  # ... then the prediction's first token:
    tree = d.propose(8)  # after a chain rejected outright one token is too little evidence
    assert tree.source is None
    d.update(Accepted([0], [101]), tree, None)
    assert d.propose(8).tokens[1:] == [102, 103]  # two tokens re-align
    assert inner.index.tokens == [1, 2, 3, 1, 2, 3, 1, 100, 101]  # kept in step throughout


def test_make_drafter_wraps_the_method_or_replaces_it(target):
    for method, inner in [("none", None), ("lookup", "lookup"), ("lookahead", "lookup")]:
        d = make_drafter(SpecConfig(method=method), target, prediction=[1, 2])
        assert isinstance(d, PredictionDrafter)
        assert (d.inner.name if d.inner else None) == inner


def _plain(target, prompt, n):
    return Engine(target).generate(prompt, max_tokens=n).token_ids


def test_greedy_output_equals_plain_decoding_with_any_prediction(tiny_models):
    target = tiny_models.load(tie=False, seed=3)
    prompt = "the cat sat on the mat"
    plain = _plain(target, prompt, 80)
    rng = random.Random(1)
    predictions = {
        "exact": plain,
        "insertion": edited(plain, 20, insert=[rng.randrange(3, 200) for _ in range(6)]),
        "deletion": edited(plain, 20, delete=8),
        "edit": edited(plain, 30, delete=4, insert=[5, 6, 7]),
        "unrelated": [rng.randrange(3, 200) for _ in range(80)],
        "empty": [],
    }
    for name, pred in predictions.items():
        for method in ("none", "lookup"):
            drafter = make_drafter(SpecConfig(method=method), target, prediction=pred)
            res = Engine(target, drafter).generate(prompt, max_tokens=80)
            assert res.token_ids == plain, (name, method)
            s = res.stats
            if name != "unrelated" and name != "empty":
                assert s.accepted_prediction_tokens >= 40, (name, method, s)
            assert s.accepted_prediction_tokens <= s.accepted
            if name == "exact":
                assert s.target_forwards <= 10 and s.rejected_prediction_tokens <= 1



def test_sampling_with_a_prediction_runs_and_counts(tiny_models):
    """Sampling verifies the prediction's chain as one-hot proposals (``verify_sampling``'s
    lossless rule, the one prompt lookup uses, tested in test_lossless.py)."""
    from edgespec.config import SamplingConfig

    target = tiny_models.load(tie=False, seed=3)
    cfg = SamplingConfig(temperature=0.7, seed=1)
    plain = Engine(target, sampling=cfg).generate("the cat", max_tokens=40)
    drafter = make_drafter(SpecConfig(method="none"), target, cfg, prediction=plain.token_ids)
    res = Engine(target, drafter, cfg).generate("the cat", max_tokens=40)
    s = res.stats
    assert len(res.token_ids) == 40
    assert s.accepted_prediction_tokens + s.rejected_prediction_tokens > 0
    assert f"prediction {s.accepted_prediction_tokens} kept / " in s.summary()


@pytest.mark.demo
def test_demo_model_edit_with_prediction_equals_plain_decoding():
    """The demo model rewriting a file of the edits workload: greedy output with the file as
    the prediction (and with text-level insertions, deletions and edits of its own answer as
    the prediction) equals plain decoding; an edit keeps most of the file."""
    import json
    from pathlib import Path

    import edgespec
    from edgespec.prompt import encode_prediction

    target = edgespec.load_target("demo", progress=False)
    row = json.loads(Path("data/workloads/edits.jsonl").read_text().splitlines()[3])
    chat = [{"role": "user", "content": row["turns"][0]}]
    plain = Engine(target).generate(chat, max_tokens=128)
    text = plain.text
    predictions = {"the file": row["prediction"],
                   "insertion": text[:60] + "    x = 1\n" + text[60:],
                   "deletion": text[:40] + text[70:],
                   "edit": text[:50] + "spam" + text[56:]}
    for name, prediction in predictions.items():
        ids = list(encode_prediction(target.tokenizer, prediction))
        for method in ("none", "lookup") if name == "the file" else ("none",):
            drafter = make_drafter(SpecConfig(method=method), target, prediction=ids)
            res = Engine(target, drafter).generate(chat, max_tokens=128)
            assert res.token_ids == plain.token_ids, (name, method)
            assert res.stats.accepted_prediction_tokens > len(plain.token_ids) // 2, (name, method)


def test_prediction_under_a_grammar_equals_constrained_plain_decoding(tiny_models):
    """Rules (a JSON schema here) cut and extend the drafted chain; the drafter still follows
    and the output is the constrained plain decoding's."""
    from edgespec.grammar import GrammarRule, from_response_format

    target = tiny_models.load(tie=False, seed=3)
    grammar = from_response_format({"type": "json_schema", "json_schema": {
        "name": "a", "strict": True, "schema": {"type": "object", "properties": {
            "ok": {"type": "boolean"}, "tag": {"enum": ["cat", "mat"]}},
        "required": ["ok", "tag"]}}})

    def run(drafter):
        rule = GrammarRule(grammar, target.tokenizer)
        return Engine(target, drafter).generate("the cat", max_tokens=40, rules=rule)

    plain = run(None)
    for prediction in (plain.text, plain.text.replace("true", "false").replace("false", "true"),
                       '{"tag": "mat", "ok": true}'):
        ids = list(target.tokenizer.encode(prediction, add_special_tokens=False))
        res = run(make_drafter(SpecConfig(method="lookup"), target, prediction=ids))
        assert res.token_ids == plain.token_ids, prediction
    assert res.stats.accepted_prediction_tokens + res.stats.rejected_prediction_tokens > 0
