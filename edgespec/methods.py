"""The drafting methods edgespec knows, as data: one :class:`Method` entry each.

Contract: every surface reads the method list from here -- config validation, the CLI's
``--method`` choices, the server's request schema and its available methods, the chat palette,
``bench`` and ``auto``'s arms. An entry says what its method needs (a separate draft model, a
trained head, the checkpoint's MTP layer), which ``SpecConfig`` fields its builder reads and
whether ``auto`` runs it as an arm. This module is the bottom layer (it imports only
``errors``); the builders that turn an entry into a drafter are ``drafters/registry.py``'s, one
per entry, keyed by name.

Adding a method is one file under ``drafters/`` plus one entry here and its builder there.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from .errors import ConfigError

_LENGTH = ("num_draft", "max_draft", "adaptive")


@dataclass(frozen=True)
class Method:
    """One drafting method: its name, a one-line summary and what it needs and reads."""

    name: str
    summary: str
    reads: tuple[str, ...] = ()  # the SpecConfig fields its builder (and its arm's) read
    needs_draft: bool = False  # a separate draft model (--draft REF)
    needs_head: bool = False  # a trained head (EAGLE-3 / Medusa) or corpus of its own name's kind
    arm: bool = False  # one of ``auto``'s arms (it stays in step with proposals it did not make)
    needs_mtp: bool = False  # the checkpoint's own multi-token-prediction layer

    def available(self, draft: object = None, heads: Collection[str] = ()) -> bool:
        """Whether it can run when ``draft`` (a reference or a loaded model; None: no draft
        model) is what was given and ``heads`` names the methods a trained head exists for
        (``drafters.registry.heads_for``), and ``mtp`` when the checkpoint ships an MTP layer."""
        return ((not (self.needs_head or self.needs_mtp) or self.name in heads)
                and (draft is not None or not self.needs_draft))

    def uses_draft(self, draft: object = None) -> bool:
        """Whether building it with ``draft`` given uses that draft model."""
        return self.needs_draft or (draft is not None and "draft" in self.reads)


# Its order is the order every surface lists methods in (and auto's arms).
METHODS: tuple[Method, ...] = (
    Method("none", "plain decoding: the target alone, one token per forward", arm=True),
    Method("lookup", "prompt lookup: copies what followed the same words earlier in the text",
           reads=("num_draft", "max_draft"), arm=True),
    Method("draft", "a smaller draft model proposes tokens, the target verifies them at once",
           reads=("draft", *_LENGTH), needs_draft=True, arm=True),
    Method("lookahead",
           "lookahead decoding: Jacobi iterations and an n-gram pool, one pass a step"),
    Method("early-exit", "the target's first layers draft for the whole target (calibrated)",
           reads=("exit_layer", *_LENGTH)),
    Method("layer-skip", "the target with a calibrated subset of its layers drafts for itself",
           reads=_LENGTH),
    Method("quantized", "the target's weights quantized to a few bits draft for the target",
           reads=("draft_bits", *_LENGTH)),
    Method("cascade", "prompt lookup drafts for the draft model, which drafts for the target",
           reads=("draft", *_LENGTH), needs_draft=True),
    Method("eagle3", "EAGLE-3: a trained head drafts a dynamic tree from the target's features "
           "(prompt lookup drafts the steps it is sure of)",
           reads=("head", "head_bits", *_LENGTH), needs_head=True, arm=True),
    Method("medusa", "Medusa: trained heads guess the next tokens from the last hidden state",
           reads=("head", *_LENGTH), needs_head=True),
    Method("corpus", "prompt lookup plus the model's own n-grams, counted over its answers by "
           "`edgespec train corpus`", reads=("head", *_LENGTH), needs_head=True, arm=True),
    Method("mtp", "the checkpoint's own multi-token-prediction layer drafts a chain (Qwen3.5/3.6, "
           "Qwen3-Next checkpoints that keep their mtp.* weights)", reads=_LENGTH, arm=True,
           needs_mtp=True),
    Method("auto", "a bandit over plain decoding, lookup (or the corpus, when the model has one), "
           "the draft model, an EAGLE-3 head and the checkpoint's MTP layer, by measured speed",
           reads=("draft", "head", "head_bits", *_LENGTH)),
)

NAMES: tuple[str, ...] = tuple(m.name for m in METHODS)


def get(name: str) -> Method:
    """The entry for ``name``; ConfigError naming it and the known methods otherwise."""
    for m in METHODS:
        if m.name == name:
            return m
    raise ConfigError(f"unknown method {name!r}; choose one of: {', '.join(NAMES)}")


def available(draft: object = None, heads: Collection[str] = ()) -> tuple[str, ...]:
    """The methods that can run when ``draft`` is what was given (None: no draft model) and
    ``heads`` names the methods with a trained head (``drafters.registry.heads_for``)."""
    return tuple(m.name for m in METHODS if m.available(draft, heads))


def readers(field_name: str) -> tuple[str, ...]:
    """The methods whose builder reads the SpecConfig field ``field_name``."""
    return tuple(m.name for m in METHODS if field_name in m.reads)
