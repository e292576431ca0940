"""The chat endpoint's tool calling: request fields -> prompt and grammar; answer -> tool_calls.

Contract. ``chat_tools`` validates ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` for the
served model's call syntax (``toolcalls.detect``); ``tool_prompt`` renders messages that carry
tools, calls or results through ``toolcalls.render`` (None: the plain chat path);
``tool_grammar`` is the answer's grammar (a required or named call; with ``response_format``
and ``"auto"``, calls or the format's JSON). ``CallFormat`` turns the answer's
text into OpenAI's ``content`` / ``tool_calls`` (whole) and ``delta.content`` /
``delta.tool_calls`` (streamed: per call, a first chunk with index, id, type, name and
``arguments: ""``, then the arguments), both read by one ``CallReader``: reassembled, a stream's
calls are the whole answer's. ``finish_reason`` is ``"tool_calls"`` when the answer holds a
call and generation stopped on its own.
"""

from __future__ import annotations

from .. import toolcalls
from ..errors import ToolCallError
from ..grammar import Grammar
from ..toolcalls import Call, ToolRequest
from .state import ServerState


def chat_tools(body, state: ServerState) -> ToolRequest | None:
    dump = lambda v: None if v is None else (  # noqa: E731
        [t.model_dump(exclude_none=True) for t in v] if isinstance(v, list)
        else v if isinstance(v, str) else v.model_dump())
    return toolcalls.tool_request(dump(body.tools), dump(body.tool_choice),
                                  body.parallel_tool_calls, syntax(state))


def chat_calls(body, state: ServerState) -> CallFormat | None:
    """The reader of a chat answer's calls; None when the request offers no tools or says
    ``tool_choice: "none"`` (validated already by ``convert.chat_request``)."""
    tools = chat_tools(body, state)
    return None if tools is None or tools.choice == "none" else CallFormat(tools)


def syntax(state: ServerState) -> toolcalls.Syntax:
    return toolcalls.detect(state.target.tokenizer)


def tool_prompt(messages: list[dict], tools: ToolRequest | None,
                state: ServerState) -> list[int] | None:
    """The prompt's token ids when tools or tool messages are involved; None otherwise."""
    if tools is None and not any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        return None
    tok = state.target.tokenizer
    text = toolcalls.render(tok, messages, tools.offered if tools else None, syntax(state))
    return tok.encode(text, add_special_tokens=False)


def tool_grammar(tools: ToolRequest | None, grammar: Grammar | None,
                 state: ServerState) -> Grammar | None:
    """The answer's grammar given ``grammar`` (``response_format``'s): ``ToolRequest.grammar``
    (required / named: the calls; auto: the calls or the format's JSON)."""
    return tools.grammar(state.target.tokenizer, grammar) if tools else grammar


def message_fields(m) -> dict:
    """A ``ChatMessage``'s tool fields as the template reads them (absent when not sent)."""
    out = {}
    if m.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in m.tool_calls]
    if m.role == "tool":
        if m.tool_call_id is None:
            raise ToolCallError("a 'tool' message needs the tool_call_id of the call it answers",
                                "tool_call_id")
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


class CallFormat:
    """One answer's text -> content and tool calls (see the module docstring)."""

    def __init__(self, tools: ToolRequest):
        self.tools = tools
        self.reader = tools.reader()
        self.calls: list[dict] = []  # OpenAI tool_call objects, in order

    def _call(self, call: Call) -> dict:
        c = {"id": self.tools.call_id(), "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}
        self.calls.append(c)
        return c

    def deltas(self, text: str, final: bool = False) -> list[dict]:
        """The stream's ``delta`` objects for ``text`` (and, when ``final``, the rest)."""
        pieces = self.reader.feed(text) + (self.reader.finish() if final else [])
        out = []
        for p in pieces:
            if isinstance(p, str):
                out.append({"content": p})
                continue
            c, index = self._call(p), len(self.calls) - 1
            out.append({"tool_calls": [{"index": index, "id": c["id"], "type": "function",
                                        "function": {"name": c["function"]["name"],
                                                     "arguments": ""}}]})
            out.append({"tool_calls": [{"index": index,
                                        "function": {"arguments": c["function"]["arguments"]}}]})
        return out

    def message(self, text: str) -> dict:
        """The whole answer's ``message``."""
        pieces = self.reader.feed(text) + self.reader.finish()
        content = "".join(p for p in pieces if isinstance(p, str)) or None
        calls = [self._call(p) for p in pieces if isinstance(p, Call)]
        return {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.calls and reason == "stop" else reason
