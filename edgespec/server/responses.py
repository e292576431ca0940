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

from ..logprobs import TokenLogprob
from ..stats import Stats
from .logprob_format import LogprobFormat
from .schemas import CompletionTokensDetails, SpeculativeUsage
from .tools import CallFormat

DONE = "data: [DONE]\n\n"
KEEP_ALIVE = ": keep-alive\n\n"  # an SSE comment: clients skip it; a closed socket fails on it


def sse(obj: dict | list[dict]) -> str:
    """One server-sent event per chunk (a list of chunks: several events, none for [])."""
    if isinstance(obj, list):
        return "".join(sse(o) for o in obj)
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


_SPECULATIVE = tuple(SpeculativeUsage.model_fields)  # the Stats.as_dict() keys usage carries
_DETAILS = tuple(CompletionTokensDetails.model_fields)  # predicted outputs' counts, also Stats'


def usage(stats: Stats) -> dict:
    s = stats.as_dict()
    return {
        "prompt_tokens": s["prompt_tokens"],
        "completion_tokens": s["generated_tokens"],
        "total_tokens": s["prompt_tokens"] + s["generated_tokens"],
        "prompt_tokens_details": {"cached_tokens": s["cached_tokens"]},
        "completion_tokens_details": {k: s[k] for k in _DETAILS},
        "speculative": {k: s[k] for k in _SPECULATIVE},
    }


class _Format:
    prefix = ""
    object_full = ""
    object_chunk = ""

    def __init__(self, model: str, include_usage: bool = False,
                 logprobs: LogprobFormat | None = None):
        self.logprobs = logprobs  # set when the request asked for them
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
    calls: CallFormat | None = None  # set when the answer is read for tool calls (tools.py)

    def opening(self) -> dict | None:
        return self.chunk({"delta": {"role": "assistant", "content": ""}, "finish_reason": None})

    def delta(self, text: str, lps: list[TokenLogprob] | None = None) -> dict | list[dict]:
        if self.calls is not None:
            return self._call_chunks(self.calls.deltas(text), lps)
        return self.chunk({"delta": {"content": text}, "finish_reason": None,
                           "logprobs": self._logprobs(lps)})

    def _call_chunks(self, deltas: list[dict], lps: list[TokenLogprob] | None) -> list[dict]:
        """Chunks for the reader's deltas; the step's logprobs ride on the first (or on an empty
        delta while the reader holds the text back)."""
        if lps and not deltas:
            deltas = [{}]
        return [self.chunk({"delta": d, "finish_reason": None,
                            "logprobs": self._logprobs(lps) if i == 0 else None})
                for i, d in enumerate(deltas)]

    def _logprobs(self, lps: list[TokenLogprob] | None) -> dict | None:
        return None if self.logprobs is None else self.logprobs.chat(lps or [])

    def closing(self, finish_reason: str) -> dict | list[dict]:
        if self.calls is not None:
            rest = self._call_chunks(self.calls.deltas("", final=True), None)
            return rest + [self.chunk({"delta": {}, "finish_reason":
                                       self.calls.finish_reason(finish_reason)})]
        return self.chunk({"delta": {}, "finish_reason": finish_reason})

    def full(self, text: str, finish_reason: str, stats: Stats,
             lps: list[TokenLogprob] | None = None) -> dict:
        message = {"role": "assistant", "content": text}
        if self.calls is not None:
            message = self.calls.message(text)
            finish_reason = self.calls.finish_reason(finish_reason)
        choice = {"index": 0, "message": message,
                  "finish_reason": finish_reason, "logprobs": self._logprobs(lps)}
        return self._envelope(self.object_full, [choice], usage=usage(stats))


class CompletionFormat(_Format):
    prefix, object_full, object_chunk = "cmpl", "text_completion", "text_completion"

    def opening(self) -> dict | None:
        return None

    def delta(self, text: str, lps: list[TokenLogprob] | None = None) -> dict:
        return self.chunk({"text": text, "finish_reason": None, "logprobs": self._logprobs(lps)})

    def _logprobs(self, lps: list[TokenLogprob] | None) -> dict | None:
        return None if self.logprobs is None else self.logprobs.completion(lps or [])

    def closing(self, finish_reason: str) -> dict:
        return self.chunk({"text": "", "finish_reason": finish_reason})

    def full(self, text: str, finish_reason: str, stats: Stats,
             lps: list[TokenLogprob] | None = None) -> dict:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason,
                  "logprobs": self._logprobs(lps)}
        return self._envelope(self.object_full, [choice], usage=usage(stats))
