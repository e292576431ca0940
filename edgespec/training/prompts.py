"""Training prompts from a ``--data`` jsonl file, every one passed through the eval exclusion.

Contract: ``read_prompts(path, exclusion)`` returns question records in the form
``answers.write_answers`` takes (``{"id": i, "prompt": last user text, "messages": [...]}``,
``messages`` only when there is more than the one user turn) and a report of what was read,
kept and dropped. One JSON object per line, in any of these layouts:

- ``{"prompt": "..."}`` (also ``question`` / ``instruction``);
- OpenAI-style ``{"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}``;
- ShareGPT-style ``{"conversations": [{"from": "system"|"human"|"gpt", "value": "..."}, ...]}``;
- MT-bench-like ``{"turns": ["...", ...]}``: the first turn only (a later turn answers a reply
  this data does not hold).

A conversation is cut after its last user turn: the target writes its own answer to it (that
answer is what a head learns), and the earlier turns stay as context. A record whose texts
overlap an evaluation prompt (``exclusion.EvalExclusion``: equal after normalisation, or an
8-word run in common, over every text of the conversation) is dropped and counted; so are exact
duplicates. A line that is not JSON, or a record in none of the layouts, is a
:class:`TrainingDataError` naming the file, the line and the layouts allowed.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError
from .exclusion import EvalExclusion, prompt_texts

LAYOUTS = ('{"prompt": str}', '{"messages": [{"role", "content"}, ...]}',
           '{"conversations": [{"from", "value"}, ...]}', '{"turns": [str, ...]}')
ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant",
         "gpt": "assistant", "bot": "assistant", "model": "assistant"}


class TrainingDataError(ConfigError):
    """A --data file that cannot be read as training prompts."""


def read_prompts(path: str | Path, exclusion: EvalExclusion) -> tuple[list[dict], dict]:
    """Question records from ``path`` (see the module docstring) and the counts."""
    path = Path(path)
    if not path.is_file():
        raise TrainingDataError(f"--data {path}: no such file; give a jsonl file of prompts")
    records, seen = [], set()
    report = {"read": 0, "kept": 0, "dropped_eval": 0, "duplicates": 0}
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            report["read"] += 1
            messages = conversation(_parse(line, path, number), path, number)
            texts = prompt_texts({"messages": messages})
            if any(exclusion.overlaps(t) for t in texts):
                report["dropped_eval"] += 1
                continue
            key = json.dumps(messages, sort_keys=True)
            if key in seen:
                report["duplicates"] += 1
                continue
            seen.add(key)
            rec = {"id": len(records), "prompt": messages[-1]["content"]}
            if len(messages) > 1:
                rec["messages"] = messages
            records.append(rec)
    report["kept"] = len(records)
    if not records:
        raise TrainingDataError(f"--data {path}: no prompt left to train on ({report['read']} read, "
                                f"{report['dropped_eval']} overlap the evaluation prompts, "
                                f"{report['duplicates']} duplicates)")
    return records, report


def _parse(line: str, path: Path, number: int) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise TrainingDataError(f"{path} line {number}: not JSON ({e.msg}); each line must be one "
                                f"object: {' or '.join(LAYOUTS)}") from None
    if not isinstance(record, dict):
        raise TrainingDataError(f"{path} line {number}: a JSON {type(record).__name__}, expected an "
                                f"object: {' or '.join(LAYOUTS)}")
    return record


def conversation(record: dict, path: Path | str = "<data>", number: int = 0) -> list[dict]:
    """The messages to answer: ``[..., {"role": "user", "content": ...}]`` (ends with a user turn)."""
    where = f"{path} line {number}"

    def bad(what: str) -> TrainingDataError:
        return TrainingDataError(f"{where}: {what}; allowed: {' or '.join(LAYOUTS)}")

    if "messages" in record or "conversations" in record:
        key = "messages" if "messages" in record else "conversations"
        items = record[key]
        if not isinstance(items, list) or not items:
            raise bad(f"{key!r} must be a non-empty list, got {items!r:.80}")
        messages = [_message(m, key, where, bad) for m in items]
    elif "turns" in record:
        turns = record["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise bad(f"'turns' must be a non-empty list of strings, got {turns!r:.80}")
        messages = [{"role": "user", "content": turns[0]}]
    else:
        text = next((record[k] for k in ("prompt", "question", "instruction") if k in record), None)
        if text is None:
            raise bad(f"no prompt field (keys: {', '.join(sorted(record)) or 'none'})")
        if not isinstance(text, str):
            raise bad(f"the prompt must be a string, got {type(text).__name__}")
        messages = [{"role": "user", "content": text}]
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise bad("the conversation has no user turn")
    messages = messages[: last_user + 1]
    if not messages[-1]["content"].strip():
        raise bad("the last user turn is empty")
    return messages


def _message(m, key: str, where: str, bad) -> dict:
    if key == "messages":
        role, content = (m.get("role"), m.get("content")) if isinstance(m, dict) else (None, None)
    else:
        role, content = (m.get("from"), m.get("value")) if isinstance(m, dict) else (None, None)
    if role not in ROLES or not isinstance(content, str):
        names = "role/content" if key == "messages" else "from/value"
        raise bad(f"each of {key!r} must be an object with {names} (roles: "
                  f"{', '.join(ROLES)}) and string text, got {m!r:.80}")
    return {"role": ROLES[role], "content": content}
