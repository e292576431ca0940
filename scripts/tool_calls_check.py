"""Do required tool calls parse and validate, and does speculation leave them unchanged?

Usage:
  python scripts/tool_calls_check.py [MODEL] [N] [METHOD]    # defaults: demo 30 lookup

``N`` questions (built here from a few cities, time zones and phrasings: no outside data) are
asked with ``TOOLS`` and ``tool_choice: "required"``, through the same pieces the server uses:
the prompt rendered by ``toolcalls.render`` (the model's template, or the fallback prompt), the
call grammar (``ToolRequest.grammar``) as a ``GrammarRule``, the answer read by
``toolcalls.read_all``. Each question is decoded greedily twice, plain and with ``METHOD``.
Reported: how many answers hold at least one call, how many calls validate against their
function's schema (jsonschema), whether the speculative answer is token-identical, and the
decode speed of both (tokens per second, prefill excluded). Prints one JSON line.
"""

from __future__ import annotations

import itertools
import json
import sys
import time

import jsonschema

import edgespec
from edgespec import Engine, SamplingConfig, SpecConfig
from edgespec.grammar import GrammarRule
from edgespec.toolcalls import detect, read_all, render, tool_request

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather forecast for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "days"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The current time in an IANA time zone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 40}},
                       "required": ["tz"]}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount between currencies",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number", "minimum": 0},
            "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "to": {"type": "string", "pattern": "^[A-Z]{3}$"}},
            "required": ["amount", "from", "to"]}}},
]
PLACES = [("Paris", "Europe/Paris", "EUR"), ("Tokyo", "Asia/Tokyo", "JPY"),
          ("Lima", "America/Lima", "PEN"), ("Oslo", "Europe/Oslo", "NOK"),
          ("Nairobi", "Africa/Nairobi", "KES"), ("Sydney", "Australia/Sydney", "AUD")]
ASKS = ["What will the weather be in {city} for the next {n} days?",
        "What time is it in {city} right now?",
        "How much is {n}0 US dollars in the currency of {city} ({cur})?",
        "Should I pack an umbrella for {city} this week?",
        "Is it too late to call someone in {city}?"]


def questions(n: int) -> list[str]:
    rows = itertools.product(ASKS, PLACES)
    return [a.format(city=c, cur=cur, n=i % 5 + 2)
            for i, (a, (c, _, cur)) in zip(range(n), itertools.cycle(rows))]


def main(model: str = "demo", n: int = 30, method: str = "lookup") -> dict:
    target = edgespec.load_target(model, progress=False)
    tok = target.tokenizer
    syntax = detect(tok)
    req = tool_request(TOOLS, "required", None, syntax)
    grammar = req.grammar(tok)
    plain = Engine(target)
    drafter = edgespec.make_drafter(SpecConfig(method=method), target, SamplingConfig())
    spec = Engine(target, drafter)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    answered = valid = calls = identical = 0
    speed = {"plain": [0, 0.0], method: [0, 0.0]}
    for q in questions(n):
        ids = tok.encode(render(tok, [{"role": "user", "content": q}], TOOLS, syntax),
                         add_special_tokens=False)
        outs = {}
        for name, engine in (("plain", plain), (method, spec)):
            out = engine.generate(ids, max_tokens=256, rules=GrammarRule(grammar, tok))
            outs[name] = out
            speed[name][0] += len(out.token_ids)
            speed[name][1] += out.stats.decode_s
        found = read_all(syntax, outs["plain"].text, req.parallel)[1]
        answered += bool(found)
        calls += len(found)
        for c in found:
            try:
                jsonschema.validate(json.loads(c.arguments), schemas[c.name])
                valid += 1
            except (jsonschema.ValidationError, KeyError, json.JSONDecodeError):
                pass
        identical += outs[method].token_ids == outs["plain"].token_ids
    return {"date": time.strftime("%Y-%m-%d"), "model": model, "syntax": syntax.name,
            "questions": n, "answered_with_calls": answered, "calls": calls,
            "calls_valid": valid, "identical_to_plain": identical, "method": method,
            "tokens_per_s": {k: round(t / s, 1) if s else None for k, (t, s) in speed.items()}}


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(main(args[0] if args else "demo", int(args[1]) if len(args) > 1 else 30,
                          args[2] if len(args) > 2 else "lookup")))
