"""Structured output as a :class:`~edgespec.rules.Rule`: a grammar masks the target's logits.

A :class:`Grammar` says what the output must be: a JSON schema, any JSON object, or a raw
grammar (lark, or a regex) for other features (tool calls) to build on. :class:`GrammarRule`
enforces it through `llguidance <https://github.com/guidance-ai/llguidance>`_ (the engine
llama.cpp and vLLM use): chosen over xgrammar and outlines-core by the per-token mask cost
measured with ``scripts/grammar_mask_cost.py`` (xgrammar also requires torch; outlines-core
compiles an index over the whole vocabulary per schema and has no recursive JSON).

Decisions:

- JSON is generated in ``json.dumps``'s default layout (``", "`` and ``": "``, no other
  whitespace): a small model cannot wander into endless newlines, and the fixed separators make
  keys and punctuation forced tokens (drafted for free).
- ``strict`` schemas (OpenAI's ``strict: true``) close every object that lists ``properties``
  (``additionalProperties: false`` where the schema does not say); a non-strict schema is still
  enforced, with JSON Schema's own default (extra properties allowed).
- EOS is allowed only where the grammar is complete, and once nothing else can follow, only EOS
  (``finished`` is then true and the engine may stop without it). Where no token of the
  vocabulary continues an incomplete answer (text the grammar requires that these tokens cannot
  spell), only EOS is allowed too, and committing it raises a ``GrammarError`` naming the field.
- Node ``u``'s row of a draft tree is masked from ``u``'s own history (the rule's contract): the
  tree is walked depth first, each node's token consumed on the way down and rolled back on the
  way up, so the committed state is unchanged after every call.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass

import llguidance
import llguidance.numpy as lnp
import mlx.core as mx
import numpy as np

from .errors import GrammarError
from .rules import Rule
from .tree import DraftTree

KINDS = ("json_schema", "json_object", "lark", "regex")
_NEG_INF_BITS = np.uint32(0xFF800000)  # float32 -inf
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""llguidance's JSON options: ``json.dumps``'s default layout (see the module docstring)."""


@dataclass(frozen=True)
class Grammar:
    """What the output must match. ``source``: the JSON schema as JSON text (``json_schema``),
    ignored for ``json_object``, the grammar text for ``lark`` and ``regex``."""

    kind: str
    source: str = ""
    strict: bool = True
    param: str = "response_format"  # the request field it came from (named in errors)

    @classmethod
    def json_schema(cls, schema: dict, strict: bool = True,
                    param: str = "response_format.json_schema.schema") -> Grammar:
        if not isinstance(schema, dict):
            raise GrammarError(f"{param} must be a JSON object (a JSON schema), got "
                               f"{type(schema).__name__}", param)
        return cls("json_schema", json.dumps(schema), bool(strict), param).checked()

    def llguidance(self) -> str:
        """The grammar in llguidance's serialized form."""
        if self.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"},
                                                                 defaults=JSON_LAYOUT)
        if self.kind == "json_schema":
            schema = json.loads(self.source)
            return llguidance.LLMatcher.grammar_from_json_schema(
                _closed(schema) if self.strict else schema, defaults=JSON_LAYOUT)
        if self.kind == "lark":
            return llguidance.LLMatcher.grammar_from_lark(self.source)
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.source)
        raise GrammarError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}",
                           self.param)

    def checked(self) -> Grammar:
        """This grammar, after llguidance compiled it without a tokenizer; a
        :class:`GrammarError` naming ``param`` and the engine's message otherwise."""
        try:
            message = llguidance.LLMatcher.validate_grammar(self.llguidance())
        except ValueError as e:
            message = str(e)
        if message:
            first = message.strip().splitlines()[0]
            raise GrammarError(f"{self.param} is not a grammar edgespec can enforce: {first}",
                               self.param)
        return self


RESPONSE_TYPES = ("text", "json_object", "json_schema")


def from_response_format(rf, param: str = "response_format") -> Grammar | None:
    """The grammar of an OpenAI ``response_format`` (a dict): None for ``{"type": "text"}`` or
    None; ``{"type": "json_object"}``; ``{"type": "json_schema", "json_schema": {"name",
    "schema", "strict"}}``. A :class:`GrammarError` names the bad field otherwise."""
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise GrammarError(f"{param} must be an object with a 'type' (one of "
                           f"{', '.join(RESPONSE_TYPES)}), got {type(rf).__name__}", param)
    kind = rf.get("type")
    if kind not in RESPONSE_TYPES:
        raise GrammarError(f"{param}.type must be one of {', '.join(RESPONSE_TYPES)}, got "
                           f"{kind!r}", f"{param}.type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar("json_object", param=param)
    spec = rf.get("json_schema")
    where = f"{param}.json_schema"
    if not isinstance(spec, dict):
        raise GrammarError(f"{where} must be an object with 'name' and 'schema' when "
                           f"{param}.type is 'json_schema', got {type(spec).__name__}", where)
    name = spec.get("name")
    if not isinstance(name, str) or not name or len(name) > 64:
        raise GrammarError(f"{where}.name must be a non-empty string of at most 64 characters, "
                           f"got {name!r}", f"{where}.name")
    strict = spec.get("strict", False)
    if not isinstance(strict, bool) and strict is not None:
        raise GrammarError(f"{where}.strict must be true or false, got {strict!r}",
                           f"{where}.strict")
    return Grammar.json_schema(spec.get("schema", {}), bool(strict), f"{where}.schema")


def check_stop(grammar: Grammar | None, stop, param: str = "stop") -> None:
    """A :class:`GrammarError` naming ``param`` when stop strings come with a grammar: a stop
    string could cut the constrained answer short (``{"a`` instead of the object), and it must
    be complete to parse and validate. The grammar already ends the answer where it is complete."""
    if grammar is not None and stop:
        raise GrammarError(f"{param} ({list(stop)!r}) does not go with {grammar.param}: a stop "
                           "string could cut the constrained answer before it is complete; leave "
                           f"{param} out (the answer ends where the grammar is complete)", param)


def _closed(schema):
    """``schema`` with ``additionalProperties: false`` on every object schema that lists
    ``properties`` and does not say otherwise (strict mode)."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def engine_tokenizer(tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of an edgespec ``Tokenizer``, built once per tokenizer (building it
    reads the whole vocabulary) and kept while the tokenizer lives."""
    lt = _TOKENIZERS.get(tokenizer)
    if lt is None:
        lt = llguidance.LLTokenizer(tokenizer.backend_json(), n_vocab=tokenizer.vocab_size,
                                    eos_token=sorted(tokenizer.eos_token_ids))
        _TOKENIZERS[tokenizer] = lt
    return lt


class GrammarRule(Rule):
    """A :class:`Grammar` enforced on the target's rows (see the module docstring). Logits
    wider than the tokenizer's vocabulary (padded embeddings): the extra columns are never
    allowed."""

    name = "grammar"

    def __init__(self, grammar: Grammar, tokenizer):
        self.grammar = grammar
        self._lt = engine_tokenizer(tokenizer)
        self._m = llguidance.LLMatcher(self._lt, grammar.llguidance(), log_level=0)
        if self._m.is_error():
            raise GrammarError(f"{grammar.param} is not a grammar edgespec can enforce: "
                               f"{self._m.get_error().strip().splitlines()[0]}", grammar.param)
        self.eos = frozenset(int(t) for t in tokenizer.eos_token_ids)
        self._bits = np.zeros((1, (self._lt.vocab_size + 31) // 32), dtype=np.int32)
        self._ended = False  # an EOS was committed

    # -- the committed state --------------------------------------------------------------------

    def reset(self, prompt: list[int]) -> None:
        self._m.reset()
        self._ended = False

    def commit(self, tokens: list[int]) -> None:
        for t in tokens:
            if self._ended:
                return
            if int(t) in self.eos:
                if not self._m.is_accepting():  # apply allowed only EOS: no token continues
                    raise GrammarError(
                        f"{self.grammar.param} cannot be completed with this model's "
                        "vocabulary: no token continues the answer here (text the grammar "
                        "requires cannot be spelled with these tokens); use one this model's "
                        "tokenizer can write", self.grammar.param)
                self._ended = True
                continue
            ok = self._m.consume_token(int(t))  # apply's masks let only allowed tokens through
            assert ok, f"token {t} committed against the grammar: {self._m.get_error()}"

    def finished(self) -> bool:
        return self._ended or self._m.is_stopped()

    # -- per node -------------------------------------------------------------------------------

    def _walk(self, tree: DraftTree, visit) -> np.ndarray:
        """Depth first over ``tree``: ``visit(u, eos)`` at each node whose path the grammar
        allows, with the matcher at ``u``'s history; returns that (N,) bool."""
        ok = np.zeros(len(tree), dtype=bool)
        ok[0] = True
        visit(0, self._ended)
        stack = [(c, False) for c in reversed(tree.children(0))]
        while stack:
            u, leaving = stack.pop()
            if leaving:
                self._m.rollback(1)
                continue
            t = int(tree.tokens[u])
            if t in self.eos:  # the end: its row and subtree allow only EOS
                ok[u] = self._m.is_accepting()
                if ok[u]:
                    visit(u, True)
                continue
            if self._m.is_stopped() or self._m.try_consume_tokens([t]) != 1:
                continue
            ok[u] = True
            visit(u, False)
            stack.append((u, True))
            stack.extend((c, False) for c in reversed(tree.children(u)))
        return ok

    def allows(self, tree: DraftTree) -> np.ndarray:
        """Whether each node's path is allowed (a node after a forbidden one is not)."""
        return self._walk(tree, lambda u, eos: None)

    def apply(self, tree: DraftTree, logits: mx.array) -> mx.array:
        n, width = logits.shape
        words = self._bits.shape[1]
        bits = np.zeros((n, words), dtype=np.int32)
        ended = np.zeros(n, dtype=bool)

        def visit(u: int, eos: bool) -> None:
            if eos:
                ended[u] = True
            else:
                lnp.fill_next_token_bitmask(self._m, bits, u)

        ok = self._walk(tree, visit)
        allowed = np.zeros((n, width), dtype=np.uint8)
        unpacked = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")
        w = min(width, self._lt.vocab_size, unpacked.shape[1])
        allowed[:, :w] = unpacked[:, :w]
        eos = [t for t in self.eos if t < width]
        empty = ended | ~allowed.any(axis=1)
        allowed[empty] = 0
        allowed[np.ix_(np.nonzero(empty)[0], eos)] = 1
        allowed[~ok] = 1  # unreachable nodes: the verifier never accepts their path
        # an additive bias of 0 / -inf, built as float32 bit patterns: several times cheaper
        # than a select over (N, V) on the CPU
        bias = mx.array(((allowed ^ 1).astype(np.uint32) * _NEG_INF_BITS).view(np.float32))
        return logits + (bias if logits.dtype == mx.float32 else bias.astype(logits.dtype))

    def forced(self, prefix: list[int], limit: int) -> list[int]:
        """The tokens that are, one after another, the only one the grammar allows after the
        committed tokens and ``prefix`` (EOS excluded: a complete grammar ends via
        ``finished``)."""
        if self._ended or limit <= 0:
            return []
        done = 0
        for t in prefix:
            if int(t) in self.eos or self._m.try_consume_tokens([int(t)]) != 1:
                self._m.rollback(done)
                return []
            done += 1
        run: list[int] = []
        while len(run) < limit and not self._m.is_stopped():
            lnp.fill_next_token_bitmask(self._m, self._bits, 0)
            only = _single(self._bits[0])
            if only is None or only in self.eos or self._m.try_consume_tokens([only]) != 1:
                break
            run.append(only)
        self._m.rollback(done + len(run))
        return run


def _single(bits: np.ndarray) -> int | None:
    """The one token set in a bitmask row, or None when zero or several are."""
    words = np.flatnonzero(bits)
    if len(words) != 1:
        return None
    w = int(bits[words[0]]) & 0xFFFFFFFF
    if w & (w - 1):
        return None
    return int(words[0]) * 32 + w.bit_length() - 1
