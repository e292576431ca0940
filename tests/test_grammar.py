"""GrammarRule: each tree node masked from its own history, forced runs, EOS, request formats."""

from __future__ import annotations

import json

import jsonschema
import mlx.core as mx
import numpy as np
import pytest

from edgespec.errors import GrammarError
from edgespec.grammar import Grammar, GrammarRule, from_response_format
from edgespec.loading.tokenizer import Tokenizer
from edgespec.tree import DraftTree

from .tiny import write_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog"]},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "pet", "ok"],
}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    write_tokenizer(d)
    return Tokenizer.from_dir(d)


def _rule(tok, grammar=None) -> GrammarRule:
    rule = GrammarRule(grammar or Grammar.json_schema(SCHEMA), tok)
    rule.reset([])
    return rule


def _row_alone(tok, grammar, history: list[int], width: int) -> np.ndarray:
    """The naive reference: a fresh rule fed ``history``, its root row's allowed set."""
    rule = _rule(tok, grammar)
    rule.commit(history)
    out = rule.apply(DraftTree.chain(0, []), mx.zeros((1, width)))
    return np.array(out[0]) > -np.inf


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_every_node_is_masked_from_its_own_history(tok):
    g = Grammar.json_schema(SCHEMA)
    rule = _rule(tok, g)
    rule.commit(_ids(tok, '{"name": "a'))
    a, b, c = _ids(tok, "b")[0], _ids(tok, '"')[0], _ids(tok, "}")[0]
    tree = DraftTree([0, a, b, c, b, a], [-1, 0, 1, 2, 0, 4])  # "b", "b\"", "b\"}" | "\"", "\"b"
    width = tok.vocab_size + 5  # padded logits: the extra columns are never allowed
    rows = np.array(rule.apply(tree, mx.zeros((len(tree), width)))) > -np.inf
    ok = rule.allows(tree)
    assert ok.tolist() == [True, True, True, False, True, False]
    base = _ids(tok, '{"name": "a')
    for u in range(len(tree)):
        if ok[u]:
            history = base + [tree.tokens[i] for i in tree.path_to(u)[1:]]
            assert (rows[u] == _row_alone(tok, g, history, width)).all(), u
            assert not rows[u, tok.vocab_size:].any()
    again = np.array(rule.apply(tree, mx.zeros((len(tree), width)))) > -np.inf
    assert (again == rows).all()  # the committed state is unchanged by a call


def test_forced_runs_are_keys_and_punctuation(tok):
    rule = _rule(tok)
    run = rule.forced([], 64)
    assert tok.decode(run) == '{"name": "'
    rule.commit(_ids(tok, '{"name": "Bo'))
    assert rule.forced(_ids(tok, '"'), 64) == _ids(tok, ', "age": ')
    assert rule.forced(_ids(tok, '"'), 3) == _ids(tok, ', "age": ')[:3]
    assert rule.forced(_ids(tok, "}"), 8) == []  # a prefix the grammar forbids
    rule.commit(_ids(tok, '", "age": 7, "pet": "'))
    assert rule.forced([], 8) == []  # "cat" or "dog": two choices
    assert tok.decode(rule.forced(_ids(tok, "d"), 64)) == 'og", "ok":'  # then " " or " t" (a merge)
    g, history = rule.grammar, _ids(tok, '{"name": "Bo", "age": 7, "pet": "d')
    run = rule.forced(_ids(tok, "d"), 64)
    for i, t in enumerate(run):  # each forced token is the only one the mask allows
        row = _row_alone(tok, g, history + run[:i], tok.vocab_size)
        assert row.sum() == 1 and row[t]


def test_eos_only_where_the_grammar_is_complete(tok):
    g = Grammar("regex", "ab|abc")
    rule = _rule(tok, g)
    eos = min(tok.eos_token_ids)
    width = tok.vocab_size
    rule.commit(_ids(tok, "a"))
    assert not _row_alone(tok, g, _ids(tok, "a"), width)[eos]
    tree = DraftTree([0, _ids(tok, "b")[0], eos, _ids(tok, "c")[0]], [-1, 0, 1, 2])
    rows = np.array(rule.apply(tree, mx.zeros((4, width)))) > -np.inf
    assert rows[1, eos] and rows[1].sum() == 2  # "ab": EOS or "c"
    assert rule.allows(tree).tolist() == [True, True, True, False]  # nothing after EOS
    rule.commit(_ids(tok, "bc"))
    assert rule.finished()
    row = _row_alone(tok, g, _ids(tok, "abc"), width)
    assert row[eos] and row.sum() == 1
    rule.commit([eos])
    assert rule.finished()


def _random_constrained(tok, grammar, seed: int, limit: int = 200) -> str:
    """Plain constrained sampling under random logits: a random walk through the grammar."""
    rule = _rule(tok, grammar)
    rng = np.random.default_rng(seed)
    out = []
    while not rule.finished() and len(out) < limit:
        row = rule.apply(DraftTree.chain(0, []), mx.array(rng.normal(size=(1, tok.vocab_size))))
        t = int(mx.argmax(row[0]).item())
        if t in tok.eos_token_ids:
            break
        rule.commit([t])
        out.append(t)
    assert rule.finished() or len(out) < limit
    return tok.decode(out)


def test_random_walks_parse_and_validate(tok):
    for seed in range(6):
        text = _random_constrained(tok, Grammar.json_schema(SCHEMA), seed)
        jsonschema.validate(json.loads(text), SCHEMA)
        assert json.dumps(json.loads(text), ensure_ascii=False) == text  # json.dumps layout


def test_json_object_takes_any_object_and_nothing_else(tok):
    doc = '{"a": [1, {"b": null}], "c": "x"}'
    rule = _rule(tok, Grammar("json_object"))
    assert rule.allows(DraftTree.chain(0, _ids(tok, doc))).all()
    for text in ("[1]", "1", '"a"'):
        assert not rule.allows(DraftTree.chain(0, _ids(tok, text))).all(), text
    rule.commit(_ids(tok, doc))
    assert rule.finished()


def test_strict_schemas_close_objects(tok):
    open_schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    strict = _rule(tok, Grammar.json_schema(open_schema, strict=True))
    loose = _rule(tok, Grammar.json_schema(open_schema, strict=False))
    for rule in (strict, loose):
        rule.commit(_ids(tok, '{"a": 1'))
    comma = _ids(tok, ",")
    assert not strict.allows(DraftTree.chain(0, comma))[1]
    assert loose.allows(DraftTree.chain(0, comma))[1]


def test_lark_grammar(tok):
    g = Grammar("lark", 'start: "call(" NUM ")"\nNUM: /[0-9]+/')
    rule = _rule(tok, g)
    assert tok.decode(rule.forced([], 16)) == "call("
    rule.commit(_ids(tok, "call(42)"))
    assert rule.finished()


@pytest.mark.parametrize("rf, param", [
    ({"type": "xml"}, "response_format.type"),
    ("json", "response_format"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}},
     "response_format.json_schema.strict"),
])
def test_bad_response_formats_name_the_field(rf, param):
    with pytest.raises(GrammarError) as e:
        from_response_format(rf)
    assert e.value.param == param
    assert param in str(e.value)


def test_response_formats():
    assert from_response_format(None) is None
    assert from_response_format({"type": "text"}) is None
    assert from_response_format({"type": "json_object"}).kind == "json_object"
    g = from_response_format({"type": "json_schema",
                              "json_schema": {"name": "p", "schema": SCHEMA, "strict": True}})
    assert g.kind == "json_schema" and g.strict and json.loads(g.source) == SCHEMA
    with pytest.raises(GrammarError, match="regex"):
        Grammar("regex", "a((", param="regex").checked()


@pytest.mark.demo
def test_demo_tokenizer_walks_a_schema():
    from edgespec.loading.hub import resolve_model
    tok = Tokenizer.from_dir(resolve_model("demo", progress=False))
    rule = _rule(tok)
    assert tok.decode(rule.forced([], 64)) == '{"name":'  # then ' "' or ' "A', ...
    doc = json.dumps({"name": "Ada", "age": 36, "pet": "cat", "ok": True})
    ids = _ids(tok, doc)
    tree = DraftTree.chain(0, ids)
    assert rule.allows(tree).all()
    rows = np.array(rule.apply(tree, mx.zeros((len(tree), tok.vocab_size)))) > -np.inf
    assert all(rows[i, t] for i, t in enumerate(ids))
    assert rows[-1].sum() == 1 and rows[-1, min(tok.eos_token_ids)]
    for seed in range(3):
        jsonschema.validate(json.loads(_random_constrained(tok, Grammar.json_schema(SCHEMA), seed)),
                            SCHEMA)


def _byte_fallback_tokenizer() -> Tokenizer:
    """A Llama / Gemma style vocabulary: metaspace pieces, bytes only as <0xXX> fallbacks."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ["▁", "a", "n", "▁a", '{"', '":', '"', "}", ",", "1", "2"]:
        vocab.setdefault(piece, len(vocab))
    backend = Backend(models.BPE(vocab, [("▁", "a")], byte_fallback=True, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    backend.add_special_tokens(["<s>", "</s>", "<unk>"])
    return Tokenizer(backend, {"eos_token": "</s>", "bos_token": "<s>"})


def test_byte_fallback_vocabularies_work_too():
    tok = _byte_fallback_tokenizer()
    for seed in range(3):
        jsonschema.validate(json.loads(_random_constrained(tok, Grammar.json_schema(SCHEMA), seed)),
                            SCHEMA)


def test_a_grammar_the_vocabulary_cannot_spell_is_a_typed_error():
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models

    vocab = {"<s>": 0, "</s>": 1, "a": 2, "b": 3}  # no "z", no byte tokens, no <unk>
    backend = Backend(models.BPE(vocab, [], byte_fallback=True))
    backend.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    backend.add_special_tokens(["<s>", "</s>"])
    tok = Tokenizer(backend, {"eos_token": "</s>", "bos_token": "<s>"})
    param = "the grammar"
    rule = _rule(tok, Grammar("regex", "zz", param=param))
    row = np.array(rule.apply(DraftTree.chain(0, []), mx.zeros((1, tok.vocab_size))))[0]
    assert np.flatnonzero(row > -np.inf).tolist() == sorted(tok.eos_token_ids)  # a dead end
    with pytest.raises(GrammarError, match="cannot be completed") as e:
        rule.commit(sorted(tok.eos_token_ids))
    assert e.value.param == param
