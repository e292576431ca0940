"""Prompts -> token ids, before any decoding: the engine's loop knows nothing of text or chat.

Contract: :func:`encode_prompt` accepts the three prompt forms of the public API -- a str is raw
text (special tokens added as the tokenizer says), a non-empty list of ``{role, content}`` dicts
goes through the model's chat template (which carries its own special tokens), a list of ints is
token ids used as given -- and raises :class:`ConfigError` for anything else or an empty prompt.
:func:`check_context` is the one context-window check: a prompt must leave room for at least one
new token.
"""

from __future__ import annotations

from typing import Union

from .errors import ConfigError, ContextOverflowError
from .loading.tokenizer import Tokenizer

Prompt = Union[str, list[dict], list[int]]


def encode_prompt(tokenizer: Tokenizer, prompt: Prompt) -> list[int]:
    """Token ids for ``prompt`` (see the module docstring for the accepted forms)."""
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        check_text_only(prompt)
        ids = tokenizer.encode(tokenizer.apply_chat_template(prompt), add_special_tokens=False)
    elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        ids = list(prompt)
    else:
        raise ConfigError(f"prompt must be a string, a list of chat messages or token ids; "
                          f"got {type(prompt).__name__}")
    if not ids or (isinstance(prompt, str) and not prompt.strip()):
        raise ConfigError("prompt is empty; give some text to continue")
    return ids


MEDIA_ELSEWHERE = ("edgespec takes text only: send the text, or run images, audio and video "
                   "with mlx-vlm (pip install mlx-vlm; python -m mlx_vlm.generate --model MODEL "
                   "--image FILE --prompt TEXT)")
"""What every error about multimodal input says to do instead (the server's too)."""


def media_part(part) -> str | None:
    """The type of a chat content part that is not text (an image, audio, a file), else None."""
    if isinstance(part, dict):
        kind = part.get("type")
        return None if kind == "text" and isinstance(part.get("text"), str) else repr(kind)
    return None if isinstance(part, str) else type(part).__name__


def check_text_only(messages: list[dict]) -> None:
    """ConfigError naming the first content part of chat ``messages`` that is not text."""
    for i, m in enumerate(messages):
        parts = m.get("content")
        for j, part in enumerate(parts if isinstance(parts, list) else ()):
            if (kind := media_part(part)) is not None:
                raise ConfigError(f"messages[{i}].content[{j}] has type {kind}, not text: "
                                  f"{MEDIA_ELSEWHERE}")


def check_context(ids: list[int], context_length: int, model: str, what: str = "prompt") -> None:
    """Raise :class:`ContextOverflowError` unless ``ids`` leave room for one new token.

    ``what`` names what the caller should shorten (the server passes the request field).
    """
    if len(ids) >= context_length:
        raise ContextOverflowError(f"the prompt has {len(ids)} tokens but the context window of "
                                   f"{model} is {context_length}; shorten the {what}")


def shared_prefix(a, b) -> int:
    """How many leading tokens two id sequences share (prefix reuse: the engine's cache, a draft
    model's, a drafter's history)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def encode_prediction(tokenizer: Tokenizer, prediction) -> tuple[int, ...]:
    """Token ids of a predicted output (``prediction=`` of the Python API and the server):
    text (encoded without special tokens: it is drafted mid-answer) or OpenAI's
    ``{"type": "content", "content": text or [{"type": "text", "text": ...}, ...]}`` (parts
    joined). ConfigError names anything else."""
    if isinstance(prediction, dict):
        if prediction.get("type") != "content":
            raise ConfigError(f"prediction type must be 'content', got {prediction.get('type')!r}")
        prediction = prediction.get("content")
        if isinstance(prediction, list) and all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                for p in prediction):
            prediction = "".join(p["text"] for p in prediction)
    if isinstance(prediction, str):
        return tuple(tokenizer.encode(prediction, add_special_tokens=False))
    raise ConfigError(f"prediction must be text or {{'type': 'content', 'content': text or "
                      f"text parts}}; got {type(prediction).__name__}")
