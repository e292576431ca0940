"""Reading tool calls out of model text: the value scanners every family's syntax shares.

Contract. A family's parser is handed the text from a call marker on and answers one of three
ways, and its answer for a text never changes once given (so a stream reads the same calls
whatever its chunking):

- ``None``: not decided yet (the call's end has not arrived);
- :data:`INVALID`: this is not a call (the marker is then plain text);
- ``(calls, end)``: the calls the region holds and the number of characters it spans.

A call's ``arguments`` is the JSON text of its arguments object, written by ``json.dumps``
(default separators, non-ASCII kept): the model may write JSON, a JSON string of JSON, or Python
keyword arguments (Gemma's and Llama 3.2's pythonic calls); the client always gets JSON.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Call:
    """One parsed call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


INVALID = "invalid"
_OPEN = {"{": "}", "[": "]", "(": ")"}


def arguments_json(value) -> str | None:
    """The arguments object as JSON text (a dict, or a JSON string holding one); None otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else None


def balanced(text: str, i: int, final: bool = False):
    """End (exclusive) of the bracketed value opening at ``text[i]``, skipping quoted strings
    (JSON's and Python's). None when it has not closed yet, INVALID when it never can (a wrong
    closing bracket; or the text is final)."""
    stack = [_OPEN[text[i]]]
    quote = None
    j = i + 1
    while j < len(text):
        c = text[j]
        if quote:
            if c == "\\":
                j += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c in _OPEN:
            stack.append(_OPEN[c])
        elif c in ")]}":
            if c != stack.pop():
                return INVALID
            if not stack:
                return j + 1
        j += 1
    return INVALID if final else None


def json_calls(value) -> list[Call] | None:
    """Calls from decoded JSON: ``{"name", "arguments" | "parameters"}`` or a list of them
    (OpenAI's ``{"type": "function", "function": {...}}`` wrapper is unwrapped)."""
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("function"), dict):
            item = item["function"]
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        args = item.get("arguments", item.get("parameters", {}))
        text = arguments_json(args)
        if not item["name"] or text is None:
            return None
        calls.append(Call(item["name"], text))
    return calls or None


def python_calls(source: str) -> list[Call] | None:
    """Calls from Python call syntax: ``f(a=1)``, ``[f(a=1), g()]``, ``print(f(a=1))``, or
    ``brave_search.call(query="x")`` (named ``brave_search``). Keyword arguments with literal
    values only."""
    try:
        node = ast.parse(source.strip(), mode="eval").body
    except SyntaxError:
        return None
    nodes = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    calls = []
    for n in nodes:
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"
                and len(n.args) == 1 and isinstance(n.args[0], ast.Call)):
            n = n.args[0]
        if not isinstance(n, ast.Call) or n.args:
            return None
        name = _call_name(n.func)
        try:
            args = {k.arg: ast.literal_eval(k.value) for k in n.keywords}
        except ValueError:
            return None
        if name is None or None in args:
            return None
        calls.append(Call(name, json.dumps(args, ensure_ascii=False)))
    return calls or None


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.attr == "call":
        return func.value.id  # Llama's built-in tools: brave_search.call(query=...)
    return None


def value_calls(text: str, i: int, final: bool):
    """The calls of one value starting at ``text[i]`` (after whitespace): a JSON object or list
    of calls, a Python call or list of calls. Returns ``(calls, end)``, None or INVALID."""
    while i < len(text) and text[i].isspace():
        i += 1
    if i == len(text):
        return INVALID if final else None
    if text[i] in "{[":
        end = balanced(text, i, final)
        if end is None or end == INVALID:
            return end
        src = text[i:end]
        try:
            calls = json_calls(json.loads(src))
        except json.JSONDecodeError:
            calls = python_calls(src) if text[i] == "[" else None
        return INVALID if calls is None else (calls, end)
    j = i
    while j < len(text) and (text[j].isalnum() or text[j] in "_.-"):
        j += 1
    if j == len(text):
        return INVALID if final else None
    if j == i or text[j] != "(":
        return INVALID
    end = balanced(text, j, final)
    if end is None or end == INVALID:
        return end
    calls = python_calls(text[i:end])
    return INVALID if calls is None else (calls, end)


def delimited(text: str, start: int, close: str, final: bool, read):
    """The calls ``read(body)`` finds in ``text[start:]`` up to the ``close`` marker (to the end
    of the text when it is final and the marker never came). Returns ``(calls, end)``, None or
    INVALID."""
    k = text.find(close, start)
    if k < 0 and not final:
        return None
    body, end = (text[start:], len(text)) if k < 0 else (text[start:k], k + len(close))
    calls = read(body)
    return INVALID if not calls else (calls, end)


def json_or_python(body: str) -> list[Call] | None:
    """Calls in a delimited body: JSON first, then Python call syntax."""
    try:
        return json_calls(json.loads(body))
    except json.JSONDecodeError:
        return python_calls(body)
