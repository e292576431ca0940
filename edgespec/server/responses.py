"""Engine output -> OpenAI response bodies: whole responses, stream chunks, usage.

Contract: ``ChatFormat`` and ``CompletionFormat`` build the dicts OpenAI's API returns for
``/v1/chat/completions`` and ``/v1/completions`` (one instance per request: one id, one
``created``). ``usage(stats)`` carries the token counts and, as the extension field
``speculative``, the request's speculative statistics. ``sse(obj)`` is one server-sent event.
"""

from __future__ import annotations

import json
import time
import uuid

from ..stats import Stats
from .schemas import SpeculativeUsage

DONE = "data: [DONE]\n\n"
KEEP_ALIVE = ": keep-alive\n\n"  # an SSE comment: clients skip it; a closed socket fails on it


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


_SPECULATIVE = tuple(SpeculativeUsage.model_fields)  # the Stats.as_dict() keys usage carries


def usage(stats: Stats) -> dict:
    s = stats.as_dict()
    return {
        "prompt_tokens": s["prompt_tokens"],
        "completion_tokens": s["generated_tokens"],
        "total_tokens": s["prompt_tokens"] + s["generated_tokens"],
        "prompt_tokens_details": {"cached_tokens": s["cached_tokens"]},
        "speculative": {k: s[k] for k in _SPECULATIVE},
    }


class _Format:
    prefix = ""
    object_full = ""
    object_chunk = ""

    def __init__(self, model: str, include_usage: bool = False):
        self.id = f"{self.prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage

    def _envelope(self, obj: str, choices: list, **extra) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, **extra}

    def chunk(self, choice: dict) -> dict:
        extra = {"usage": None} if self.include_usage else {}
        return self._envelope(self.object_chunk, [{"index": 0, "logprobs": None, **choice}], **extra)

    def usage_chunk(self, stats: Stats) -> dict:
        return self._envelope(self.object_chunk, [], usage=usage(stats))


class ChatFormat(_Format):
    prefix, object_full, object_chunk = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def opening(self) -> dict | None:
        return self.chunk({"delta": {"role": "assistant", "content": ""}, "finish_reason": None})

    def delta(self, text: str) -> dict:
        return self.chunk({"delta": {"content": text}, "finish_reason": None})

    def closing(self, finish_reason: str) -> dict:
        return self.chunk({"delta": {}, "finish_reason": finish_reason})

    def full(self, text: str, finish_reason: str, stats: Stats) -> dict:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": finish_reason, "logprobs": None}
        return self._envelope(self.object_full, [choice], usage=usage(stats))


class CompletionFormat(_Format):
    prefix, object_full, object_chunk = "cmpl", "text_completion", "text_completion"

    def opening(self) -> dict | None:
        return None

    def delta(self, text: str) -> dict:
        return self.chunk({"text": text, "finish_reason": None})

    def closing(self, finish_reason: str) -> dict:
        return self.chunk({"text": "", "finish_reason": finish_reason})

    def full(self, text: str, finish_reason: str, stats: Stats) -> dict:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        return self._envelope(self.object_full, [choice], usage=usage(stats))
