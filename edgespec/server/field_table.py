"""The request fields of both endpoints as one Markdown table, generated from the request models.

Contract: ``markdown()`` is the whole of ``docs/api_fields.md``: one row per field path (nested
objects as ``a.b``, array items as ``a[].b``) with its JSON type, the endpoints that take it and
its description, all read from the models' JSON schema; then the fields refused as "not
supported" (each model's ``UNSUPPORTED``, ``request_model.py``). ``scripts/api_fields.py``
writes it; a test checks the committed file equals it, so a field added to a model is
documented by re-running the script.
"""

from __future__ import annotations

from .request_model import RequestModel
from .schemas import ChatCompletionRequest, CompletionRequest

ENDPOINTS = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest}
MAX_DEPTH = 3  # objects nested deeper than this are described by their parent's row

HEADER = """# Request fields of the OpenAI-compatible server

Generated from the server's request models by `python scripts/api_fields.py`; do not edit.
Every field a request sends is either listed here or refused with a 400 that names it: a field
of OpenAI's API that edgespec does not implement says "not supported" and what to do instead,
any other is an unknown field. Descriptions starting "edgespec:" are edgespec's own fields.

"""


def _type(prop: dict, defs: dict) -> tuple[str, str | None]:
    """(a readable type, the name of the object definition to describe below it, if one)."""
    options = [p for p in prop.get("anyOf", [prop]) if p.get("type") != "null"]
    names, inner = [], None
    for p in options:
        if "$ref" in p:
            inner = p["$ref"].rsplit("/", 1)[-1]
            names.append("object")
        elif p.get("type") == "array":
            item, inner_item = _type(p.get("items", {}), defs)
            names.append(f"array of {item}")
            inner = inner_item
        elif "enum" in p:
            names.append(" or ".join(repr(v) for v in p["enum"]))
        elif "oneOf" in p:  # a tagged union of objects (the parts of a message's content)
            names.append("object")
        elif "const" in p:
            names.append(repr(p["const"]))
        elif p.get("type") == "object" and isinstance(p.get("additionalProperties"), dict):
            names.append(f"object of {_type(p['additionalProperties'], defs)[0]}")
        else:
            names.append(p.get("type", "any"))
    return " or ".join(dict.fromkeys(names)), (inner if len(options) == 1 else None)


def _rows(schema: dict, defs: dict, prefix: str, depth: int, where: dict) -> list[tuple]:
    rows = []
    for name, prop in schema.get("properties", {}).items():
        path = prefix + name
        kind, inner = _type(prop, defs)
        description = prop.get("description") or defs.get(inner or "", {}).get("description", "")
        rows.append((path, kind, " ".join(description.split())))
        if inner is not None and depth < MAX_DEPTH:
            sub = path + ("[]." if kind.startswith("array") else ".")
            where.setdefault(inner, sub)
            rows += _rows(defs[inner], defs, sub, depth + 1, where)
    return rows


def _models() -> dict[str, type]:
    out, todo = {}, [RequestModel]
    while todo:
        for cls in todo.pop().__subclasses__():
            out.setdefault(cls.__name__, cls)
            todo.append(cls)
    return out


def _refused(root: type, where: dict) -> list[tuple]:
    models = _models()
    places = [("", root)] + [(p, models[n]) for n, p in where.items() if n in models]
    return [(prefix + name, "", f"**not supported** (400): {why}")
            for prefix, cls in places for name, why in cls.UNSUPPORTED.items()
            if name not in cls.model_fields]


def table() -> list[tuple[str, str, tuple[str, ...], str]]:
    """(field path, type, endpoints, description) rows: taken fields first, then refused ones."""
    taken, refused = {}, {}
    for endpoint, model in ENDPOINTS.items():
        schema, where = model.model_json_schema(), {}
        defs = schema.get("$defs", {})
        for path, kind, text in _rows(schema, defs, "", 0, where):
            taken.setdefault((path, kind, text), []).append(endpoint)
        for path, kind, text in _refused(model, where):
            refused.setdefault((path, kind, text), []).append(endpoint)
    return [(p, k, tuple(e), t) for rows in (taken, refused) for (p, k, t), e in rows.items()]


def markdown() -> str:
    short = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
    lines = ["| field | type | endpoints | description |", "|---|---|---|---|"]
    for path, kind, endpoints, text in table():
        cells = (f"`{path}`", kind, ", ".join(short[e] for e in endpoints), text)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return HEADER + "\n".join(lines) + "\n"
