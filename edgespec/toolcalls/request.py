"""A request's tool fields, validated: what is offered, what is required, how calls are read.

Contract. :func:`tool_request` checks OpenAI's ``tools``, ``tool_choice`` and
``parallel_tool_calls`` (a :class:`~edgespec.errors.ToolCallError` names the bad field) and
returns a :class:`ToolRequest`, or None when the request has no tools. Semantics, as OpenAI's:

- ``tool_choice`` defaults to ``"auto"`` with tools; it needs ``tools``.
- ``"none"``: the model answers in text. The tools are left out of the prompt (the model cannot
  call what it is not shown, and a small model shown tools tends to call them anyway) and the
  answer is never read for calls.
- ``"auto"``: the tools are offered; the answer is read for calls.
- ``"required"`` / ``{"type": "function", "function": {"name": ...}}``: decoding is constrained
  to calls (to that function), their arguments valid under its ``parameters`` schema.
- ``parallel_tool_calls`` (default true): false keeps at most one call (and constrains to one).
- with ``response_format`` (JSON object or schema): ``"auto"`` constrains the answer to calls
  or that JSON; required / named to calls; ``"none"`` to the JSON.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from ..errors import ToolCallError
from ..grammar import Grammar
from .constrain import call_grammar, call_or_answer_grammar
from .stream import CallReader
from .syntax import Syntax

CHOICES = ("none", "auto", "required")
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[dict, ...]  # OpenAI's tool objects, as sent
    choice: str  # "none" | "auto" | "required" | the one function's name
    parallel: bool
    syntax: Syntax

    @property
    def offered(self) -> list[dict] | None:
        """The tools the prompt shows (None for ``tool_choice: "none"``)."""
        return None if self.choice == "none" else list(self.tools)

    def grammar(self, tokenizer, answer: Grammar | None = None) -> Grammar | None:
        """The grammar of the answer, given ``answer`` (``response_format``'s grammar, if any):
        required / named: the calls (``answer`` does not apply: the answer is a call);
        ``"auto"``: the calls or ``answer``'s JSON (None without ``answer``: free text);
        ``"none"``: ``answer``."""
        if self.choice == "none":
            return answer
        if self.choice == "auto":
            return answer and call_or_answer_grammar(self.syntax, list(self.tools),
                                                     self.parallel, tokenizer, answer)
        chosen = [t for t in self.tools
                  if self.choice == "required" or t["function"]["name"] == self.choice]
        return call_grammar(self.syntax, chosen, self.parallel, tokenizer)

    def reader(self) -> CallReader | None:
        """A reader of the answer's calls; None when calls are never read (``"none"``)."""
        return None if self.choice == "none" else CallReader(self.syntax, self.parallel)

    def call_id(self) -> str:
        """A fresh call id: ``call_`` and 24 hex digits; Mistral's templates insist on 9
        letters and digits."""
        hexes = uuid.uuid4().hex
        return hexes[:9] if self.syntax.name.startswith("mistral") else f"call_{hexes[:24]}"


def tool_request(tools, tool_choice, parallel, syntax: Syntax) -> ToolRequest | None:
    """The validated tool fields (see the module docstring); None without tools."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise ToolCallError(f"tool_choice {tool_choice!r} needs tools; send tools or leave "
                                "tool_choice out", "tool_choice")
        if tools is not None and not isinstance(tools, list):
            raise ToolCallError(f"tools must be a list of tools, got {type(tools).__name__}",
                                "tools")
        return None
    if not isinstance(tools, list):
        raise ToolCallError(f"tools must be a list of tools, got {type(tools).__name__}", "tools")
    checked = tuple(_tool(t, i) for i, t in enumerate(tools))
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ToolCallError(f"tools names the function {dup!r} twice; names must be unique",
                            "tools")
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolCallError(f"parallel_tool_calls must be true or false, got {parallel!r}",
                            "parallel_tool_calls")
    choice = _choice(tool_choice, names)
    return ToolRequest(checked, choice, parallel is not False, syntax)


def _tool(tool, i: int) -> dict:
    where = f"tools.{i}"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise ToolCallError(f"{where}.type must be 'function' (the one tool type), got "
                            f"{tool.get('type') if isinstance(tool, dict) else tool!r}",
                            f"{where}.type")
    f = tool.get("function")
    if not isinstance(f, dict):
        raise ToolCallError(f"{where}.function must be an object with a 'name'",
                            f"{where}.function")
    name = f.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ToolCallError(f"{where}.function.name must be 1-64 letters, digits, '_' or '-', "
                            f"got {name!r}", f"{where}.function.name")
    params = f.get("parameters")
    if params is not None and (not isinstance(params, dict) or
                               params.get("type", "object") != "object"):
        raise ToolCallError(f"{where}.function.parameters must be a JSON schema of an object, "
                            f"got {params!r:.80}", f"{where}.function.parameters")
    return tool


def _choice(tool_choice, names: list[str]) -> str:
    if tool_choice is None:
        return "auto"
    if isinstance(tool_choice, str):
        if tool_choice not in CHOICES:
            raise ToolCallError(f"tool_choice must be one of {', '.join(CHOICES)} or "
                                f"{{'type': 'function', 'function': {{'name': ...}}}}, got "
                                f"{tool_choice!r}", "tool_choice")
        return tool_choice
    f = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = f.get("name") if isinstance(f, dict) else None
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or name is None:
        raise ToolCallError("tool_choice must be 'none', 'auto', 'required' or {'type': "
                            f"'function', 'function': {{'name': ...}}}}, got {tool_choice!r:.80}",
                            "tool_choice")
    if name not in names:
        raise ToolCallError(f"tool_choice names the function {name!r}, which is not in tools "
                            f"({', '.join(names)})", "tool_choice.function.name")
    return name
