"""Request and response bodies of the OpenAI-compatible endpoint (pydantic; FastAPI's schema).

Contract: request models check *types* only (strictly: ``"5"`` is not an integer); *values* are
checked by building edgespec's config dataclasses from them (``convert.py``), so the server
accepts exactly what the CLI and the Python API accept, with the same messages. The generation
fields (sampling, speculation, stop conditions) are *generated* from those dataclasses
(``options.SURFACES["request"]``): names, types, descriptions and the method names of the
registry.

Nothing a request sends is ignored (``request_model.py``): a field is defined here or refused
with a 400 naming it, "not supported" for OpenAI's fields in a model's ``UNSUPPORTED``, unknown
otherwise. Fields taken only with some values (``n``, ``store``, ``service_tier``, ...) say so in
their description and are refused otherwise (``convert.py``, ``openai_fields.py``).
``docs/api_fields.md`` is generated from these models (``field_table.py``; ``python
scripts/api_fields.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, create_model

from .. import options
from .request_model import RequestModel
from .tool_schemas import TOOL_CHOICE, NamedToolChoice, Tool, ToolCallIn, ToolCallOut

OPENAI_FIELDS = ("max_tokens", "temperature", "top_p", "seed", "stop", "frequency_penalty",
                 "presence_penalty")
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


_Request = RequestModel


class TextPart(_Request):
    type: Literal["text"]
    text: str


class MediaPart(_Request):
    """An image, audio, video or file part: accepted by the schema so that the answer is
    ``convert.py``'s error naming it and what runs it, not a type error (so its other fields
    are allowed: the whole part is refused)."""

    model_config = ConfigDict(strict=True, extra="allow")

    type: Literal["image_url", "input_image", "image", "input_audio", "audio", "video_url",
                  "video", "file", "input_file"]


Part = Annotated[TextPart | MediaPart, Field(discriminator="type")]


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"] = Field(
        description="'developer' is treated as 'system'; 'tool' carries a call's result")
    content: str | list[Part] | None = Field(
        None, description="a string, or a list of text parts (joined); null only for assistant. "
                          "Image, audio, video and file parts get a 400 naming them (text only)")
    tool_calls: list[ToolCallIn] | None = Field(None, description="assistant: the calls it made")
    tool_call_id: str | None = Field(None, description="tool: the call this is the result of")
    UNSUPPORTED = {"audio": "edgespec takes text only", "function_call": "use tool_calls "
                   "(function_call is OpenAI's deprecated form of it)",
                   "refusal": "send the refusal's text as content"}
    name: str | None = None


class StreamOptions(_Request):
    include_usage: bool | None = Field(
        False, description="send a last chunk with the usage (and the speculative statistics)")
    include_obfuscation: bool | None = Field(
        None, description="only false: no obfuscation padding is added to the chunks (a local "
                          "server; true gets a 400)")


class _OpenAIFields(_Request):
    model: str | None = Field(None, description="the served model's name (or an alias); default: it")
    n: Int | None = Field(None, description="number of choices; only 1 is supported")
    stream: bool | None = Field(False, description="stream server-sent events")
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    user: str | None = Field(None, description="an id of the end user (OpenAI's; deprecated "
                             "there for safety_identifier): accepted, recorded nowhere")
    logit_bias: dict[str, Int | float] | None = Field(
        None, description="only {} (no bias): a non-empty bias gets a 400")


GenerationFields = create_model("GenerationFields", __base__=_OpenAIFields, **request_fields())
"""The fields both endpoints share: OpenAI's own, then those generated from the configs."""


class Prediction(_Request):
    type: str = Field(description="only 'content' (OpenAI's one type)")
    content: str | list[TextPart] = Field(
        description="the text the answer is expected to mostly be (the file an edit rewrites); "
                    "text parts are joined. It is drafted while the answer follows it: faster, "
                    "same output")


class JsonSchemaFormat(_Request):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)
    name: str = Field(description="the schema's name (1-64 characters)")
    description: str | None = Field(None, description="accepted (not shown to the model)")
    schema_: dict | None = Field(None, alias="schema", description="a JSON schema the output "
                                 "must validate against (enforced by a grammar)")
    strict: bool | None = Field(False, description="true: objects allow only their listed "
                                "properties where the schema does not say otherwise")


class ResponseFormat(_Request):
    type: str = Field(description="'text' (default), 'json_object' (any JSON object) or "
                                  "'json_schema' (output validates against json_schema.schema)")
    json_schema: JsonSchemaFormat | None = Field(None, description="with type 'json_schema': "
                                                 "the schema and its name")


RESPONSE_FORMAT = ("structured output: the output is constrained to parse (and validate); "
                   "speculation stays lossless under it")


class _ChatOpenAIFields(GenerationFields):
    """OpenAI's chat fields about accounting and routing (``convert.check_chat_extras``), and
    those it has that edgespec does not implement."""

    UNSUPPORTED = {
        "functions": "use tools (functions is OpenAI's deprecated form of it)",
        "function_call": "use tool_choice (function_call is OpenAI's deprecated form of it)",
        "audio": "edgespec answers in text only",
        "reasoning_effort": "the reasoning of a model that thinks is not configurable here",
        "verbosity": "say how long to answer in the messages, or set max_completion_tokens",
        "web_search_options": "edgespec does not search the web",
    }
    metadata: dict[str, str] | None = Field(
        None, description="up to 16 key-value pairs (keys up to 64 characters, values up to "
                          "512), checked as OpenAI checks them; stored nowhere")
    store: bool | None = Field(None, description=(
        "false or left out: no completion is kept to retrieve; false also keeps the request out of "
        "the recordings for learning (`edgespec learn`), which a server with learning on makes of "
        "every other chat request"))
    service_tier: str | None = Field(
        None, description="'auto' or 'default' (every request is served the same way); "
                          "'flex', 'scale' and 'priority' get a 400")
    safety_identifier: str | None = Field(None, description="an id of the end user (OpenAI's): "
                                          "accepted, recorded nowhere")
    prompt_cache_key: str | None = Field(
        None, description="accepted: the prompt's longest prefix shared with any finished "
                          "request the prefix cache keeps is reused whatever the key "
                          "(usage.prompt_tokens_details.cached_tokens)")
    prompt_cache_retention: str | None = Field(
        None, description="only 'in_memory' (finished requests' KV is kept in memory, under "
                          "the KV budget)")
    modalities: list[str] | None = Field(None, description="only ['text']")


class ChatCompletionRequest(_ChatOpenAIFields):
    messages: list[ChatMessage]
    max_completion_tokens: Int | None = Field(None, description="alias of max_tokens")
    prediction: Prediction | None = Field(None, description="predicted output (OpenAI's)")
    response_format: ResponseFormat | None = Field(None, description=RESPONSE_FORMAT)
    logprobs: bool | None = Field(False, description="return each output token's log-probability "
                                  "under the model's raw distribution (before penalties, "
                                  "grammar, temperature and truncation)")
    top_logprobs: Int | None = Field(None, description="with logprobs: also the 0-20 likeliest "
                                     "tokens at each position")
    tools: list[Tool] | None = Field(None, description="functions the model may call (written "
                                     "in the model's own call syntax, read back as tool_calls)")
    tool_choice: str | NamedToolChoice | None = Field(None, description=TOOL_CHOICE)
    parallel_tool_calls: bool | None = Field(None, description="default true; false: at most "
                                             "one call")


class CompletionRequest(GenerationFields):
    prompt: str | list[str] | list[Int] = Field(
        description="raw text (no chat template), a one-element list of text, or token ids")
    echo: bool | None = Field(False, description="not supported (must be false)")
    suffix: str | None = Field(
        None, description="fill-in-the-middle: the text after the hole, prompt the text before "
                          "it; the prompt is built in the model's own FIM format (StarCoder, "
                          "Qwen2.5-Coder, CodeLlama, DeepSeek-Coder tokens). A model without FIM "
                          "tokens gets a 400; empty or null: a plain completion")
    best_of: Int | None = Field(None, description="only 1 is supported")
    response_format: ResponseFormat | None = Field(None, description=RESPONSE_FORMAT)
    logprobs: Int | None = Field(None, description="return each output token's log-probability "
                                 "(the model's raw distribution) and the 0-20 likeliest tokens "
                                 "at its position (OpenAI allows 0-5)")


# Responses: documented in the OpenAPI schema; the server builds the same shapes as dicts.

class SpeculativeUsage(BaseModel):
    method: str
    tau: float = Field(description="tokens committed per target forward, bonus token included")
    proposed: int = Field(description="draft tokens proposed")
    accepted: int = Field(description="draft tokens accepted")
    forced: int = Field(description="tokens a grammar (response_format, a required tool call) "
                        "forced, verified for free; counted in neither proposed nor accepted")
    acceptance_rate: float
    target_forwards: int
    tokens_per_s: float = Field(description="decode speed, prefill excluded")


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(description="prompt tokens whose KV was reused from the prefix "
                                           "cache")


class CompletionTokensDetails(BaseModel):
    accepted_prediction_tokens: int = Field(
        description="tokens drafted from the request's prediction that the model kept")
    rejected_prediction_tokens: int = Field(
        description="tokens drafted from the prediction that the model rejected (verified in the "
                    "same forwards, not part of the answer)")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails
    speculative: SpeculativeUsage = Field(description="edgespec extension")


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None = Field(description="null when the answer is only tool calls")
    tool_calls: list[ToolCallOut] | None = None


class TopLogprob(BaseModel):
    token: str = Field(description="the token's text ('bytes:\\xNN' for part of a character)")
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None
    refusal: None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int] = Field(description="characters of the completion before each token")


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChatLogprobs | None = None


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
    logprobs: CompletionLogprobs | None = None


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


class PrefixCacheHealth(BaseModel):
    lookups: int = Field(description="prompts looked up in the prefix cache")
    hits: int = Field(description="prompts that reused a cached prefix")
    hit_tokens: int = Field(description="prompt tokens whose KV came from the cache")
    prompt_tokens: int = Field(description="prompt tokens looked up")
    hit_rate: float | None = Field(description="hit_tokens / prompt_tokens (null before any)")


class Health(BaseModel):
    status: Literal["ok", "stopped"]
    model: str
    method: str = Field(description="the default drafting method")
    methods: list[str] = Field(description="methods a request may choose")
    queued: int = Field(description="requests waiting for a place in the batch")
    busy: bool = Field(description="whether any request is decoding")
    active: int = Field(description="requests decoding now")
    served: int
    cancelled: int
    failed: int
    max_concurrency: int = Field(description="requests decoded at once (--max-concurrency)")
    max_queue: int = Field(description="requests that may wait; one more gets 429 (--max-queue)")
    kv_budget_mb: int = Field(description="KV cache budget in MiB (--kv-budget-mb)")
    tokens_per_s: float | None = Field(None, description="tokens generated per second, all "
                                       "requests together, over the last 10 seconds")
    acceptance: dict[str, float | None] | None = Field(
        None, description="per method: drafted tokens the target accepted / drafted (null "
        "before any were drafted)")
    prefix_cache: PrefixCacheHealth | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail
