"""Fill-in-the-middle: the code before and after a hole -> the prompt that asks a code model for
the middle, in the format its family was trained on.

Contract: ``fim_format(tokenizer)`` finds the format from the tokenizer's own FIM tokens (None
when it has none: the model was not trained to fill in); ``encode_fim(tokenizer, prefix,
suffix)`` returns the prompt's token ids, or raises ``ConfigError`` saying the model has no FIM
tokens. Every format is PSM (prefix, suffix, middle), each family's documented order:

- StarCoder, SantaCoder, StarCoder2 (and tokenizers derived from theirs):
  ``<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>``
- Qwen2.5-Coder: ``<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>``
- CodeLlama: ``<PRE> {prefix} <SUF>{suffix} <MID>`` (Meta's ``infilling_prompt_tokens``: the
  prefix encoded with SentencePiece's leading space, the suffix without it); the middle ends
  with ``<EOT>``, which is not the model's EOS, so it is returned as a stop string
- DeepSeek-Coder: ``<｜fim▁begin｜>{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>``

The markers are token ids, never text: each piece of text is encoded on its own, and the BOS
goes first when the tokenizer adds one (CodeLlama, DeepSeek-Coder). Prompt lookup needs nothing
more: the suffix is part of the prompt, so its n-grams are in the drafter's index from the start
and a middle that re-joins the suffix is drafted from it (``tests/test_fim.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError
from .loading.tokenizer import Tokenizer


@dataclass(frozen=True)
class FimFormat:
    family: str
    prefix: tuple[str, ...]  # spellings of the marker token in the vocabulary (any one)
    suffix: tuple[str, ...]
    middle: tuple[str, ...]
    stop: tuple[str, ...] = ()  # text that ends the middle besides EOS
    bare_suffix: bool = False  # encode the suffix without SentencePiece's leading space


FORMATS = (
    FimFormat("starcoder", ("<fim_prefix>",), ("<fim_suffix>",), ("<fim_middle>",)),
    FimFormat("qwen2.5-coder", ("<|fim_prefix|>",), ("<|fim_suffix|>",), ("<|fim_middle|>",)),
    FimFormat("codellama", ("▁<PRE>", "<PRE>"), ("▁<SUF>", "<SUF>"), ("▁<MID>", "<MID>"),
              stop=("<EOT>",), bare_suffix=True),
    FimFormat("deepseek-coder", ("<｜fim▁begin｜>",), ("<｜fim▁hole｜>",), ("<｜fim▁end｜>",)),
)
FAMILIES = ", ".join(f.family for f in FORMATS)


def _marker(tokenizer: Tokenizer, spellings: tuple[str, ...]) -> int | None:
    return next((i for s in spellings if (i := tokenizer.token_to_id(s)) is not None), None)


def fim_format(tokenizer: Tokenizer) -> FimFormat | None:
    """The FIM format whose three marker tokens the tokenizer has (None: it has none)."""
    for fmt in FORMATS:
        if all(_marker(tokenizer, m) is not None for m in (fmt.prefix, fmt.suffix, fmt.middle)):
            return fmt
    return None


def require_format(tokenizer: Tokenizer, model: str) -> FimFormat:
    """``fim_format``, or a ConfigError saying the model cannot fill in the middle."""
    fmt = fim_format(tokenizer)
    if fmt is None:
        raise ConfigError(f"{model} has no fill-in-the-middle tokens in its tokenizer (edgespec "
                          f"knows the formats of {FAMILIES}), so it cannot complete code between "
                          "a prefix and a suffix; use a code model trained for it, or send the "
                          "prefix alone")
    return fmt


def _bare(tokenizer: Tokenizer, text: str) -> list[int]:
    """``text``'s ids without the leading space SentencePiece adds (Meta's ``encode_infilling``:
    encode after a newline, which never merges with what follows, and drop the newline)."""
    lead = tokenizer.encode("\n", add_special_tokens=False)
    ids = tokenizer.encode("\n" + text, add_special_tokens=False)
    return ids[len(lead):] if ids[:len(lead)] == lead else tokenizer.encode(text, False)


def encode_fim(tokenizer: Tokenizer, prefix: str, suffix: str, model: str = "the model") -> list[int]:
    """Token ids of the prompt asking for the text between ``prefix`` and ``suffix``."""
    for name, text in (("prefix", prefix), ("suffix", suffix)):
        if not isinstance(text, str):
            raise ConfigError(f"the FIM {name} must be a str, got {type(text).__name__}")
    fmt = require_format(tokenizer, model)
    pre, suf, mid = (_marker(tokenizer, m) for m in (fmt.prefix, fmt.suffix, fmt.middle))
    bos = tokenizer.bos_token_id
    lead = [bos] if bos is not None and tokenizer.encode("x")[:1] == [bos] else []
    tail = _bare(tokenizer, suffix) if fmt.bare_suffix else tokenizer.encode(suffix, False)
    return [*lead, pre, *tokenizer.encode(prefix, False), suf, *tail, mid]
