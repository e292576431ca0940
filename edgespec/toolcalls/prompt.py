"""Chat messages with tools -> the prompt text, through the model's own chat template.

Contract. :func:`render` takes OpenAI-shaped messages (``role`` system / user / assistant /
tool; an assistant message may carry ``tool_calls`` with ``function.arguments`` as a JSON
string and ``content`` None; a tool message carries ``tool_call_id``) and the request's tools
(OpenAI's ``[{"type": "function", "function": {name, description, parameters}}]``).

- A template that reads ``tools`` gets them the way transformers passes them (``tools=``, the
  list as sent), and the messages with each call's ``arguments`` decoded to an object (what
  HF templates expect: they write it with ``tojson``). Phi-4-mini's template reads the tools
  from the system message's ``tools`` key (a JSON string): they are put there.
- A template without tool support gets the documented fallback (:data:`FALLBACK`): the tools
  and the call syntax in the system message, earlier calls written in the family's syntax in
  the assistant's text, tool results as user turns (``<tool_response>`` blocks; Gemma's
  ````tool_output```` blocks), consecutive turns of one role merged (Gemma's template insists
  that roles alternate).
"""

from __future__ import annotations

import json

import jinja2
import jinja2.meta

from .syntax import Syntax, write

FALLBACK = (
    "You can call functions to help answer. The functions, as JSON schemas:\n{tools}\n"
    "To call one or more of them, answer with only the call{s}, in exactly this format:\n"
    "{example}\n"
    "Otherwise, answer normally.")
"""The system text for templates without tool support (``{tools}``: one JSON object per line;
``{example}``: a call in the family's syntax)."""


def template_reads(template: str, name: str) -> bool:
    """Whether the jinja ``template`` reads the variable ``name`` (``tools``: tool support)."""
    try:
        return name in jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(template))
    except jinja2.TemplateSyntaxError:
        return False


def supports_tools(tokenizer) -> str | None:
    """How the model's template takes tools: ``"tools"`` (the variable), ``"system"`` (the
    system message's ``tools`` key, Phi-4-mini) or None (the fallback prompt)."""
    if not tokenizer.has_chat_template:
        return None
    source = tokenizer.chat_template
    if template_reads(source, "tools"):
        return "tools"
    if "message['tools']" in source or 'message["tools"]' in source or "message.tools" in source:
        return "system"
    return None


def render(tokenizer, messages: list[dict], tools: list[dict] | None, syntax: Syntax) -> str:
    """The prompt text for ``messages`` and ``tools`` (None: no tools offered)."""
    how = supports_tools(tokenizer)
    if how == "tools":
        return tokenizer.apply_chat_template(_decoded(messages), tools=tools or None)
    if how == "system":
        return tokenizer.apply_chat_template(_with_system_tools(_decoded(messages), tools))
    return tokenizer.apply_chat_template(fallback_messages(messages, tools, syntax))


def _decoded(messages: list[dict]) -> list[dict]:
    """The messages for an HF template: content never None, call arguments as objects."""
    out = []
    for m in messages:
        m = {**m, "content": m.get("content") or ""}
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"],
                                                  "arguments": _loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def _loads(arguments):
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return arguments


def _with_system_tools(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    if not tools:
        return messages
    listed = json.dumps([t["function"] for t in tools], ensure_ascii=False)
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "tools": listed}, *messages[1:]]
    return [{"role": "system", "content": "", "tools": listed}, *messages]


def instruction(tools: list[dict], syntax: Syntax) -> str:
    """The fallback's system text for ``tools`` in ``syntax``."""
    first = tools[0]["function"]
    example_args = {k: "..." for k in (first.get("parameters") or {}).get("properties", {})}
    return FALLBACK.format(
        tools="\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools),
        s="s" if syntax.joiner else "", example=write(syntax, [(first["name"], example_args)]))


def fallback_messages(messages: list[dict], tools: list[dict] | None,
                      syntax: Syntax) -> list[dict]:
    """Plain ``{role, content}`` messages carrying the tools, the calls and their results."""
    out: list[dict] = []
    if tools:
        out.append({"role": "system", "content": instruction(tools, syntax)})
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if m.get("tool_calls"):
            calls = [(c["function"]["name"], _loads(c["function"]["arguments"]))
                     for c in m["tool_calls"]]
            content = (content + "\n" if content else "") + write(syntax, calls)
        if role == "tool":
            role = "user"
            content = (f"```tool_output\n{content}\n```" if syntax.name == "gemma"
                       else f"<tool_response>\n{content}\n</tool_response>")
        if out and out[-1]["role"] == role:
            out[-1] = {"role": role, "content": out[-1]["content"] + "\n\n" + content}
        else:
            out.append({"role": role, "content": content})
    return out
