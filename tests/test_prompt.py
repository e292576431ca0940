"""Prompt encoding and the context-window check, before any decoding (``edgespec/prompt.py``)."""

from __future__ import annotations

import pytest

from edgespec.errors import ConfigError, ContextOverflowError
from edgespec.loading.tokenizer import Tokenizer
from edgespec.prompt import check_context, encode_prompt

from .tiny import make_tiny_model


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_dir(make_tiny_model(tmp_path_factory.mktemp("prompt")))


def test_raw_text_chat_messages_and_ids(tok):
    assert encode_prompt(tok, "the cat") == tok.encode("the cat")
    chat = [{"role": "user", "content": "the cat"}]
    ids = encode_prompt(tok, chat)
    assert ids == tok.encode(tok.apply_chat_template(chat), add_special_tokens=False)
    assert tok.decode(ids).startswith("<|im_start|>user\nthe cat<|im_end|>")
    assert encode_prompt(tok, ids) == ids and encode_prompt(tok, ids) is not ids  # a copy


@pytest.mark.parametrize("prompt, message", [
    ("", "prompt is empty"),
    ("  \n", "prompt is empty"),
    ([], "prompt is empty"),
    (None, "got NoneType"),
    (b"bytes", "got bytes"),
    ([1, "two"], "got list"),
    ([{"role": "user", "content": "x"}, 3], "got list"),
])
def test_bad_prompts_name_what_was_given(tok, prompt, message):
    with pytest.raises(ConfigError, match=message):
        encode_prompt(tok, prompt)


def test_chat_messages_without_content_are_rejected(tok):
    with pytest.raises(ConfigError, match="'role' and 'content'"):
        encode_prompt(tok, [{"role": "user"}])


def test_context_check_leaves_room_for_one_token():
    check_context([1] * 9, 10, "m")
    with pytest.raises(ContextOverflowError, match=r"has 10 tokens .* of m is 10; shorten the messages"):
        check_context([1] * 10, 10, "m", "messages")
