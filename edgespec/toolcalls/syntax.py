"""Each model family's tool-call syntax: how its calls look, how to read them, how to write them.

A :class:`Syntax` names its ``markers`` (strings that open a call anywhere in the text) and its
``leading`` openers (that open a call only where the answer starts, or right after another call:
Llama's and Gemma's bare JSON), reads a region from a marker on (``read``; see ``parse.py`` for
its three answers) and writes calls the way the model writes them (``write``: for the prompt's
history of earlier calls, the fallback prompt's instruction, and the constrained grammar). The
families:

- ``hermes`` (Qwen2.5/3, QwQ, SmolLM3, Hermes; the fallback for templates without tool support):
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per call.
- ``llama3`` (Llama 3.1-3.3): ``{"name": ..., "parameters": {...}}`` as the whole answer,
  optionally after ``<|python_tag|>``; calls separated by ``;``; Llama 3.2's pythonic
  ``[f(a=1), g()]`` and the built-in ``brave_search.call(query=...)`` are read too.
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``, and the newer
  ``[TOOL_CALLS]name[ARGS]{...}`` (templates that know ``[ARGS]``, written as such).
- ``phi4`` (Phi-4-mini): ``<|tool_call|>[...]<|/tool_call|>`` and ``functools[...]``.
- ``gemma`` (prompt-based, no tool tokens): ``{"name": ..., "parameters": {...}}`` as the answer,
  Python calls ``[f(a=1)]``, or a ````tool_code```` block holding ``print(f(a=1))``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from .parse import (INVALID, Call, arguments_json, balanced, delimited, json_or_python,
                    value_calls)


@dataclass(frozen=True)
class Syntax:
    name: str
    markers: tuple[str, ...]
    leading: tuple[str, ...]
    separators: str  # characters skipped between two calls (besides whitespace)
    read: Callable  # (text starting at a marker or opener, final) -> (calls, end) | None | INVALID
    args_key: str  # the key the family writes the arguments under
    opening: str  # the text (or special token) before the written calls ("" for none)
    closing: str
    joiner: str  # between two written calls
    wrap_list: bool  # several calls are written as one JSON list


def _hermes(text: str, final: bool):
    return delimited(text, len("<tool_call>"), "</tool_call>", final, json_or_python)


def _llama3(text: str, final: bool):
    start = len("<|python_tag|>") if text.startswith("<|python_tag|>") else 0
    return value_calls(text, start, final)


def _mistral(text: str, final: bool):
    i = len("[TOOL_CALLS]")
    rest = text[i:].lstrip()
    if not rest:
        return INVALID if final else None
    if rest[0] in "[{":
        return value_calls(text, i, final)
    k = text.find("[ARGS]", i)
    head = text[i:] if k < 0 else text[i:k]
    if k < 0:  # "[ARGS]" may be arriving: drop its beginning from the name's end
        head = head[:len(head) - max((n for n in range(1, 7) if "[ARGS]".startswith(head[-n:])),
                                     default=0)]
    name = head.split("[CALL_ID]")[0].strip()
    if not all(c.isalnum() or c in "_-." for c in name) or (k < 0 and final):
        return INVALID
    if k < 0:
        return None
    start = len(text) - len(text[k + len("[ARGS]"):].lstrip())
    if start == len(text):
        return INVALID if final else None
    if text[start] != "{" or not name:
        return INVALID
    end = balanced(text, start, final)
    if end is None or end == INVALID:
        return end
    args = arguments_json(text[start:end])
    return INVALID if args is None else ([Call(name, args)], end)


def _phi4(text: str, final: bool):
    if text.startswith("<|tool_call|>"):
        return delimited(text, len("<|tool_call|>"), "<|/tool_call|>", final, json_or_python)
    i = len("functools")
    if len(text) == i:
        return INVALID if final else None
    return value_calls(text, i, final) if text[i] == "[" else INVALID


def _gemma(text: str, final: bool):
    if text.startswith("```tool_code"):
        return delimited(text, len("```tool_code"), "```", final, json_or_python)
    return value_calls(text, 0, final)


SYNTAXES = {s.name: s for s in (
    Syntax("hermes", ("<tool_call>",), (), "", _hermes, "arguments",
           "<tool_call>\n", "\n</tool_call>", "\n</tool_call>\n<tool_call>\n", False),
    Syntax("llama3", ("<|python_tag|>",), ("{", "["), ";", _llama3, "parameters",
           "", "", "; ", False),
    Syntax("mistral", ("[TOOL_CALLS]",), (), "", _mistral, "arguments",
           "[TOOL_CALLS]", "", ", ", True),
    Syntax("mistral_args", ("[TOOL_CALLS]",), (), "", _mistral, "arguments",
           "[TOOL_CALLS]", "", "", False),
    Syntax("phi4", ("<|tool_call|>", "functools"), (), "", _phi4, "arguments",
           "functools", "", ", ", True),
    Syntax("gemma", ("```tool_code",), ("{", "["), "", _gemma, "parameters",
           "", "", "\n", False),
)}


def write(syntax: Syntax, calls: list[tuple[str, dict]]) -> str:
    """``calls`` (name, arguments) as the family writes them (``mistral_args``: ``name[ARGS]``)."""
    if syntax.name == "mistral_args":
        return "".join(f"[TOOL_CALLS]{n}[ARGS]{json.dumps(a, ensure_ascii=False)}"
                       for n, a in calls)
    bodies = [json.dumps({"name": n, syntax.args_key: a}, ensure_ascii=False) for n, a in calls]
    inner = f"[{', '.join(bodies)}]" if syntax.wrap_list else syntax.joiner.join(bodies)
    return syntax.opening + inner + syntax.closing


def detect(tokenizer) -> Syntax:
    """The syntax of the model behind ``tokenizer``, from its vocabulary's tool tokens and its
    chat template; ``hermes`` when neither names one (the fallback prompt teaches it)."""
    has = lambda token: tokenizer.token_to_id(token) is not None  # noqa: E731
    template = tokenizer.chat_template if tokenizer.has_chat_template else ""
    if has("[TOOL_CALLS]"):
        return SYNTAXES["mistral_args" if has("[ARGS]") or "[ARGS]" in template else "mistral"]
    if has("<|tool_call|>") or "functools" in template:
        return SYNTAXES["phi4"]
    if has("<|python_tag|>") and "<|start_header_id|>" in template:
        return SYNTAXES["llama3"]
    if "<tool_call>" in template:
        return SYNTAXES["hermes"]
    if "<start_of_turn>" in template:
        return SYNTAXES["gemma"]
    return SYNTAXES["hermes"]
