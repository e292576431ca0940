"""The editor workloads' prompt rows in ``bench``: what a row may carry besides its prompt, how
such a row is generated, and whether a structured answer is valid.

Contract: ``row_fields(obj, where)`` checks a prompt file row's ``prediction`` (text: a predicted
output, drafted first by every method but the baseline, ``drafters/prediction.py``),
``response_format`` (OpenAI's: the answer is generated under the grammar, ``grammar.py``) and
``suffix`` (fill-in-the-middle: the prompt is the code before the hole, sent in the model's own
FIM format, ``fim.py``), and refuses a field bench cannot run yet (``REFUSED_FIELDS``) with a
ConfigError naming the row; nothing is silently ignored. ``generate_row`` runs one generation
of a row; ``valid_answer`` says whether a JSON answer parses and validates.
"""

from __future__ import annotations

import json
from dataclasses import replace

from .config import GenerationConfig
from .engine import Engine, Result
from .errors import ConfigError

REFUSED_FIELDS = {  # row fields bench cannot run yet, and why: refused, never ignored
    "tools": "tool calls are not wired into bench yet",
}


def row_fields(obj: dict, where: str) -> dict:
    """The row's ``prediction``, ``response_format`` and ``suffix`` (None when absent), checked;
    ConfigError naming ``where`` (file:line) otherwise."""
    refused = [f"{k!r} ({why})" for k, why in REFUSED_FIELDS.items() if obj.get(k) is not None]
    if refused:
        raise ConfigError(f"{where}: this row has {', '.join(refused)}; remove the field to bench "
                          "the prompt without it")
    prediction, response_format, suffix = (obj.get(k) for k in
                                           ("prediction", "response_format", "suffix"))
    for name, value, what in (("prediction", prediction, "the predicted output"),
                              ("suffix", suffix, "the code after the hole")):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{where}: \"{name}\" must be text ({what}), got "
                              f"{type(value).__name__}")
    if suffix is not None and response_format is not None:
        raise ConfigError(f"{where}: a row has \"suffix\" (fill-in-the-middle) or "
                          "\"response_format\", not both")
    if response_format is not None:
        from .grammar import from_response_format

        try:
            from_response_format(response_format)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
    return {"prediction": prediction, "response_format": response_format, "suffix": suffix}


def generate_row(engine: Engine, row, raw: bool, generation: GenerationConfig) -> Result:
    """One generation of ``row`` (a ``bench.BenchPrompt``): as a chat message (``raw``: the
    text itself), under its response_format's grammar (a fresh rule each time: a rule holds one
    generation's state), or as a FIM prompt stopping where its middle ends."""
    tok = engine.target.tokenizer
    if row.suffix is not None:
        from .fim import encode_fim, fim_format

        ids = encode_fim(tok, row.text, row.suffix, engine.target.name)
        stop = generation.stop + tuple(fim_format(tok).stop)
        return engine.generate(ids, generation=replace(generation, stop=stop))
    rules = None
    if row.response_format is not None:
        from .grammar import GrammarRule, from_response_format

        grammar = from_response_format(row.response_format)
        rules = GrammarRule(grammar, tok) if grammar is not None else None
    query = row.text if raw else [{"role": "user", "content": row.text}]
    return engine.generate(query, generation=generation, rules=rules)


def valid_answer(text: str, response_format: dict | None) -> bool | None:
    """Whether ``text`` parses as JSON and validates against the response_format's schema
    (None: the row has no JSON response_format)."""
    if response_format is None or response_format.get("type") not in ("json_object", "json_schema"):
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return False
    if response_format["type"] == "json_object":
        return isinstance(obj, dict)
    import jsonschema

    try:
        jsonschema.validate(obj, response_format["json_schema"].get("schema", {}))
    except jsonschema.ValidationError:
        return False
    return True
