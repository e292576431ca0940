"""``tool_choice: "required"`` or a named function -> the grammar every answer must match.

Contract. :func:`call_grammar` returns a lark :class:`~edgespec.grammar.Grammar` (llguidance's
dialect) for an answer that is exactly one call, or with ``parallel`` one or more, written in the
family's syntax (``syntax.write``'s layout): the marker, then a JSON object whose ``name`` is one
of the allowed functions and whose arguments (under the family's key) satisfy that function's
``parameters`` schema (an ``anyOf`` over the functions), then the closing marker. The
arguments are generated under the schema's strict form (OpenAI's ``strict: true``: objects that
list ``properties`` are closed where the schema does not say otherwise), whatever the tool's
``strict`` says: a subset of what the schema allows, so they validate either way, and a small
model cannot wander into invented keys. JSON is laid
out as ``grammar.JSON_LAYOUT`` says, so the keys and punctuation are forced tokens. A marker
that is one token of the vocabulary (Qwen's ``<tool_call>``, Mistral's ``[TOOL_CALLS]``) is
that token, not its spelling. Families that write several calls as one list (Mistral, Phi-4)
or cannot write several (Llama 3, Gemma: one JSON object per answer) get one call or a list.

``tool_choice: "auto"`` with a ``response_format`` (an agent's "call a tool, or give the typed
answer"): :func:`call_or_answer_grammar` allows either those calls or the format's JSON.
"""

from __future__ import annotations

import json
import re

from ..grammar import JSON_LAYOUT, Grammar, _closed
from .syntax import Syntax

ARGS_LIMIT = 4  # calls one constrained answer may hold: a small model may repeat calls forever
_SPECIAL = re.compile(r"(<[^<>\s]+>|\[[A-Z_]+\])")


def call_schema(tools: list[dict], args_key: str) -> dict:
    """JSON schema of one call object to any of ``tools``."""
    options = []
    for t in tools:
        params = {k: v for k, v in _arguments(t).items() if k != "x-guidance"}
        options.append({"type": "object",
                        "properties": {"name": {"const": t["function"]["name"]}, args_key: params},
                        "required": ["name", args_key], "additionalProperties": False})
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": JSON_LAYOUT}


def _literal(text: str, tokenizer) -> str:
    """``text`` in lark: each piece that looks like a special token (``<...>``, ``[...]``) and is
    one token of the vocabulary becomes that token; the rest are strings."""
    out = []
    for piece in _SPECIAL.split(text):
        token = tokenizer.token_to_id(piece) if _SPECIAL.fullmatch(piece) else None
        if token is not None:
            out.append(f"<[{token}]>")
        elif piece:
            out.append(json.dumps(piece))
    return " ".join(out)


def call_grammar(syntax: Syntax, tools: list[dict], parallel: bool, tokenizer,
                 param: str = "tool_choice") -> Grammar:
    """The grammar of a constrained answer (see the module docstring)."""
    return Grammar("lark", "\n".join(_call_lines(syntax, tools, parallel, tokenizer)),
                   param=param).checked()


def call_or_answer_grammar(syntax: Syntax, tools: list[dict], parallel: bool, tokenizer,
                           answer: Grammar) -> Grammar:
    """``tool_choice: "auto"`` with a ``response_format``: the answer is either calls (as
    :func:`call_grammar` has them) or JSON that ``answer`` (a ``json_object`` or
    ``json_schema`` grammar) accepts, in the same layout."""
    lines = _call_lines(syntax, tools, parallel, tokenizer)
    lines[0] = "calls:" + lines[0].removeprefix("start:")
    return Grammar("lark", "\n".join(["start: calls | answer", *lines,
                                       "answer: %json " + json.dumps(_answer_schema(answer))]),
                   param=answer.param).checked()


def _answer_schema(answer: Grammar) -> dict:
    if answer.kind == "json_object":
        return {"type": "object", "x-guidance": JSON_LAYOUT}
    assert answer.kind == "json_schema", answer.kind  # response_format makes only these two
    schema = json.loads(answer.source)
    return {**(_closed(schema) if answer.strict else schema), "x-guidance": JSON_LAYOUT}


def _call_lines(syntax: Syntax, tools: list[dict], parallel: bool, tokenizer) -> list[str]:
    """The lark rules of the calls, ``start`` first."""
    more = "{0,%d}" % (ARGS_LIMIT - 1)
    if syntax.name == "mistral_args":
        marker, args = _literal("[TOOL_CALLS]", tokenizer), _literal("[ARGS]", tokenizer)
        rules = [f"call_{i}: {marker} {json.dumps(t['function']['name'])} {args} "
                 f"%json {json.dumps(_arguments(t))}" for i, t in enumerate(tools)]
        lines = [f"start: call call{more}" if parallel else "start: call", "call: " + " | ".join(
            f"call_{i}" for i in range(len(tools))), *rules]
    else:
        call = "call: %json " + json.dumps(call_schema(tools, syntax.args_key))
        opening, closing = _literal(syntax.opening, tokenizer), _literal(syntax.closing, tokenizer)
        if syntax.wrap_list:
            calls = f'call (", " call){more}' if parallel else "call"
            lines = [f'start: {opening} "[" {calls} "]" {closing}', call]
        elif syntax.name == "hermes":
            blocks = f'block ("\\n" block){more}' if parallel else "block"
            lines = [f"start: {blocks}", f"block: {opening} call {closing}", call]
        else:  # one JSON object is the whole answer
            lines = [f"start: {opening} call {closing}", call]
    return lines


def _arguments(tool: dict) -> dict:
    f = tool["function"]
    params = f.get("parameters") or {"type": "object", "properties": {}}
    return {**_closed(params), "x-guidance": JSON_LAYOUT}
