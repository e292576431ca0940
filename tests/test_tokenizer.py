"""Tokenizer (encode/decode, special tokens, chat template) and StreamDecoder, on a tiny byte-level
BPE vocabulary built directly with ``tokenizers`` (independent of the GGUF converter)."""

from __future__ import annotations

import random

import pytest

from edgespec.errors import ConfigError, TokenizerError
from edgespec.loading.tokenizer import CHATML_TEMPLATE, StreamDecoder, Tokenizer

from ._gguf_fixtures import SPECIALS, TOKENS, write_tokenizer_dir

TEXTS = ["Hello world", "the 2024 café", "naïve – ünïcödé 日本語 😀🎉", "  spaces\n\ttabs  ",
         "<|im_start|>user\nhi<|im_end|>", ""]


@pytest.fixture()
def tok(tmp_path):
    return Tokenizer.from_dir(write_tokenizer_dir(tmp_path / "m"))


def test_encode_decode_round_trip(tok):
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("Hello world") == [TOKENS.index("Hello"), TOKENS.index("Ġworld")]


def test_special_tokens_are_single_ids(tok):
    ids = tok.encode("<|im_start|>user<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(ids, skip_special_tokens=True) == "user"
    assert tok.bos_token_id == 1 and tok.eos_token_ids == frozenset({2})
    assert tok.vocab_size == len(TOKENS) == len(tok.vocab())
    assert all(tok.vocab()[s] == i for i, s in enumerate(SPECIALS))


def test_add_bos_token_from_config(tmp_path):
    tok = Tokenizer.from_dir(write_tokenizer_dir(tmp_path, {"add_bos_token": True}))
    assert tok.encode("Hello") == [1, TOKENS.index("Hello")]
    assert tok.encode("<|im_start|>Hello") == [1, TOKENS.index("Hello")]  # never twice
    assert tok.encode("Hello", add_special_tokens=False) == [TOKENS.index("Hello")]


def test_eos_ids_are_the_union_of_both_configs(tmp_path):
    tok = Tokenizer.from_dir(write_tokenizer_dir(tmp_path, generation={"eos_token_id": [0, 1]}))
    assert tok.eos_token_ids == frozenset({0, 1, 2})
    tok = Tokenizer.from_dir(write_tokenizer_dir(tmp_path / "b", {"eos_token": {"content": "<|endoftext|>"}}))
    assert tok.eos_token_ids == frozenset({0})  # AddedToken-dict form


def test_eos_falls_back_to_a_known_end_token(tmp_path):
    tok = Tokenizer.from_dir(write_tokenizer_dir(tmp_path, {"eos_token": None, "bos_token": None}))
    assert tok.eos_token_ids == frozenset({2}) and tok.bos_token_id is None


def test_chat_template_rendering(tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(messages) == (
        "<|im_start|><|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.apply_chat_template(messages[1:], add_generation_prompt=False).endswith("Hi<|im_end|>\n")
    assert tok.has_chat_template


def test_chat_template_raise_exception_is_a_config_error(tok):
    with pytest.raises(ConfigError, match="unknown role robot"):
        tok.apply_chat_template([{"role": "robot", "content": "beep"}])
    with pytest.raises(ConfigError, match="'role' and 'content'"):
        tok.apply_chat_template([{"text": "no role"}])


def test_chatml_fallback_and_template_sources(tmp_path):
    tok = Tokenizer.from_dir(write_tokenizer_dir(tmp_path / "a", {"chat_template": None}))
    assert not tok.has_chat_template and tok.chat_template == CHATML_TEMPLATE
    assert tok.apply_chat_template([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ 1 + 1 }}"}]
    tok = Tokenizer.from_dir(write_tokenizer_dir(tmp_path / "b", {"chat_template": named}))
    assert tok.apply_chat_template([]) == "D2"
    loops = "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}"
    tok = Tokenizer.from_dir(write_tokenizer_dir(tmp_path / "g", {"chat_template": loops}))
    assert tok.apply_chat_template([{"role": "a", "content": "x"}] * 2) == "<x><x>"
    directory = write_tokenizer_dir(tmp_path / "c")
    (directory / "chat_template.jinja").write_text("J{{ messages | length }}{{ messages | tojson }}")
    assert Tokenizer.from_dir(directory).apply_chat_template([{"role": "u", "content": "é"}]) == (
        'J1[{"role": "u", "content": "é"}]')  # tojson keeps non-ASCII, like HF


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json in .*empty.*tokenizer_config\.json"):
        Tokenizer.from_dir(tmp_path / "empty")
    bad = write_tokenizer_dir(tmp_path / "bad")
    (bad / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"bad/tokenizer\.json"):
        Tokenizer.from_dir(bad)
    cfg = write_tokenizer_dir(tmp_path / "cfg")
    (cfg / "tokenizer_config.json").write_text("[1, 2")
    with pytest.raises(TokenizerError, match=r"cfg/tokenizer_config\.json"):
        Tokenizer.from_dir(cfg)
    broken = write_tokenizer_dir(tmp_path / "tpl", {"chat_template": "{% for %}"})
    with pytest.raises(TokenizerError, match="chat template.*does not compile"):
        Tokenizer.from_dir(broken)


def _stream(tok, ids, **kwargs) -> list[str]:
    decoder = StreamDecoder(tok, **kwargs)
    return [decoder.add(i) for i in ids] + [decoder.flush()]


def test_stream_deltas_concatenate_to_decode(tok):
    for text in TEXTS:
        ids = tok.encode(text)
        assert "".join(_stream(tok, ids)) == tok.decode(ids) == text
        assert "".join(_stream(tok, ids, skip_special_tokens=True)) == tok.decode(ids, True)


def test_stream_holds_back_a_split_emoji(tok):
    ids = tok.encode("a😀b")
    assert ids[1] == TOKENS.index("ðŁ") and len(ids) == 5  # a, F0 9F, 98, 80, b
    assert _stream(tok, ids) == ["a", "", "", "😀", "b", ""]


def test_stream_random_ids_including_broken_utf8(tok):
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 12))]
        assert "".join(_stream(tok, ids)) == tok.decode(ids)


def test_stream_flush_emits_an_incomplete_tail(tok):
    ids = tok.encode("x😀")[:-1]
    decoder = StreamDecoder(tok)
    assert [decoder.add(i) for i in ids] == ["x", "", ""]
    assert decoder.flush() == "\ufffd" and decoder.flush() == ""
