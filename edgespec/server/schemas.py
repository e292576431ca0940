"""Request and response bodies of the OpenAI-compatible endpoint (pydantic; FastAPI's schema).

Contract: request models check *types* only (strictly: ``"5"`` is not an integer); *values* are
checked by building edgespec's config dataclasses from them (``convert.py``), so the server
accepts exactly what the CLI and the Python API accept, with the same messages. The allowed
``method`` names and the field descriptions come from those definitions too. Fields an OpenAI
client commonly sends that edgespec does not use (``frequency_penalty``, ``user``, ``tools``, ...)
are accepted and ignored.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ..config import METHODS, GenerationConfig, SamplingConfig, SpecConfig, fields_of

Method = Literal[METHODS]  # type: ignore[valid-type]  # the names the engine knows, read at import


def _integral(v):
    """JSON has one number type: 16.0 is the integer 16 (as in JSON Schema); 16.5 stays wrong."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


Int = Annotated[int, BeforeValidator(_integral)]


def _help(cls, name: str) -> str:
    return next(f.metadata.get("help", "") for f in fields_of(cls) if f.name == name)


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


class GenerationFields(_Request):
    model: str | None = Field(None, description="the served model's name (or an alias); default: it")
    max_tokens: Int | None = Field(None, description=_help(GenerationConfig, "max_tokens"))
    temperature: float | None = Field(None, description=_help(SamplingConfig, "temperature"))
    top_p: float | None = Field(None, description=_help(SamplingConfig, "top_p"))
    top_k: Int | None = Field(None, description="edgespec: " + _help(SamplingConfig, "top_k"))
    min_p: float | None = Field(None, description="edgespec: " + _help(SamplingConfig, "min_p"))
    seed: Int | None = Field(None, description=_help(SamplingConfig, "seed"))
    stop: str | list[str] | None = Field(None, description=_help(GenerationConfig, "stop"))
    n: Int | None = Field(None, description="number of choices; only 1 is supported")
    stream: bool | None = Field(False, description="stream server-sent events")
    stream_options: StreamOptions | None = None
    method: Method | None = Field(None, description="edgespec: " + _help(SpecConfig, "method")
                                  + " [default: the server's --method]")
    num_draft: Int | None = Field(None, description="edgespec: " + _help(SpecConfig, "num_draft"))


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
