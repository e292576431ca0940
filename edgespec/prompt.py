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
        ids = tokenizer.encode(tokenizer.apply_chat_template(prompt), add_special_tokens=False)
    elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        ids = list(prompt)
    else:
        raise ConfigError(f"prompt must be a string, a list of chat messages or token ids; "
                          f"got {type(prompt).__name__}")
    if not ids or (isinstance(prompt, str) and not prompt.strip()):
        raise ConfigError("prompt is empty; give some text to continue")
    return ids


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
