"""Request and response bodies of the OpenAI-compatible endpoint (pydantic; FastAPI's schema).

Contract: request models check *types* only (strictly: ``"5"`` is not an integer); *values* are
checked by building edgespec's config dataclasses from them (``convert.py``), so the server
accepts exactly what the CLI and the Python API accept, with the same messages. The generation
fields (sampling, speculation, stop conditions) are *generated* from those dataclasses
(``options.SURFACES["request"]``): names, types, descriptions and the method names of the
registry. Fields an OpenAI client commonly sends that edgespec does not use
(``frequency_penalty``, ``user``, ``tools``, ...) are accepted and ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, create_model

from .. import options

OPENAI_FIELDS = ("max_tokens", "temperature", "top_p", "seed", "stop")
"""Generated fields that OpenAI's API also has; the others are described as edgespec's own."""


def _integral(v):
    """JSON has one number type: 16.0 is the integer 16 (as in JSON Schema); 16.5 stays wrong."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


Int = Annotated[int, BeforeValidator(_integral)]


def request_type(f: dataclasses.Field):
    """The request field type of a config field (checked strictly; values by the dataclass).

    A field with ``choices`` is any string, documented with its choices: an unknown value gets
    the config's own error, which names the allowed ones."""
    t = options.kind(f)
    if t is tuple:
        return str | list[str]
    if f.metadata.get("choices"):
        return Annotated[str, WithJsonSchema({"type": "string", "enum": list(f.metadata["choices"])})]
    return Int if t is int else t


def request_fields(surface: str = "request") -> dict:
    """pydantic field definitions for ``surface``'s config fields: all optional, None = not sent."""
    out = {}
    for f in options.SURFACES[surface].fields():
        prefix = "" if f.name in OPENAI_FIELDS else "edgespec: "
        out[f.name] = (Optional[request_type(f)],
                       Field(None, description=prefix + options.describe(f, surface)))
    return out


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant"] = Field(
        description="'developer' is treated as 'system'")
    content: str | list[TextPart] | None = Field(
        None, description="a string, or a list of text parts (joined); null only for assistant")


class StreamOptions(_Request):
    include_usage: bool | None = Field(
        False, description="send a last chunk with the usage (and the speculative statistics)")


class _OpenAIFields(_Request):
    model: str | None = Field(None, description="the served model's name (or an alias); default: it")
    n: Int | None = Field(None, description="number of choices; only 1 is supported")
    stream: bool | None = Field(False, description="stream server-sent events")
    stream_options: StreamOptions | None = None


GenerationFields = create_model("GenerationFields", __base__=_OpenAIFields, **request_fields())
"""The fields both endpoints share: OpenAI's own, then those generated from the configs."""


class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage]
    max_completion_tokens: Int | None = Field(None, description="alias of max_tokens")


class CompletionRequest(GenerationFields):
    prompt: str | list[str] | list[Int] = Field(
        description="raw text (no chat template), a one-element list of text, or token ids")
    echo: bool | None = Field(False, description="not supported (must be false)")
    suffix: str | None = Field(None, description="not supported (must be empty)")
    best_of: Int | None = Field(None, description="only 1 is supported")


# Responses: documented in the OpenAPI schema; the server builds the same shapes as dicts.

class SpeculativeUsage(BaseModel):
    method: str
    tau: float = Field(description="tokens committed per target forward, bonus token included")
    proposed: int = Field(description="draft tokens proposed")
    accepted: int = Field(description="draft tokens accepted")
    acceptance_rate: float
    target_forwards: int
    tokens_per_s: float = Field(description="decode speed, prefill excluded")


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(description="prompt tokens whose KV was reused from the last request")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    speculative: SpeculativeUsage = Field(description="edgespec extension")


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "stopped"]
    model: str
    method: str = Field(description="the default drafting method")
    methods: list[str] = Field(description="methods a request may choose")
    queued: int
    busy: bool
    served: int
    cancelled: int
    failed: int


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail
