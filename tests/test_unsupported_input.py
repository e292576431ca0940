"""Multimodal input on the Python API: a chat message with an image, audio or file part is
refused with a ConfigError naming the part, its type and what runs it (mlx-vlm). The server's
answer to the same (a 400 with the part as ``param``) is in ``tests/test_server_errors.py``;
model types edgespec does not run, in ``tests/test_families.py``.
"""

from __future__ import annotations

import pytest

import edgespec
from edgespec.errors import ConfigError
from edgespec.prompt import check_text_only

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


@pytest.mark.parametrize("messages, where, kind", [
    ([{"role": "user", "content": [{"type": "text", "text": "what is it?"}, IMAGE]}],
     "messages[0].content[1]", "'image_url'"),
    ([{"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": ""}}]}],
     "messages[1].content[0]", "'input_audio'"),
    ([{"role": "user", "content": [b"\x89PNG"]}], "messages[0].content[0]", "bytes"),
])
def test_media_parts_are_named(messages, where, kind):
    with pytest.raises(ConfigError) as e:
        check_text_only(messages)
    message = str(e.value)
    assert where in message and kind in message and "mlx_vlm.generate" in message


def test_text_parts_and_strings_pass():
    check_text_only([{"role": "user", "content": "hi"},
                     {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                     {"role": "assistant", "content": None}])


def test_chat_refuses_an_image(tiny_models):
    with edgespec.load(str(tiny_models.path()), progress=False) as llm:
        with pytest.raises(ConfigError, match=r"messages\[0\]\.content\[1\] has type 'image_url'"):
            llm.chat([{"role": "user", "content": [{"type": "text", "text": "hi"}, IMAGE]}])
        assert llm.chat("the cat", max_tokens=2).text is not None  # and still answers text
