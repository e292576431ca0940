"""OpenAI request bodies -> validated generation requests for the worker.

Contract: ``chat_request`` / ``completion_request`` either return a ``GenRequest`` the engine
will accept (token ids within the context window, config objects built) or raise a typed error
that ``errors.py`` maps to a 4xx: ``ModelNotFoundError`` for a model name the server does not
serve, ``RequestError`` for an unsupported field value, ``ConfigError`` (from the config
dataclasses, message unchanged) for a bad sampling / stop / method value,
``ContextOverflowError`` for a prompt that does not fit. Encoding happens here, on the request's
thread, so a bad request is answered at once rather than after the queue. The generated fields
(``options.SURFACES["request"]``) become configs through ``options``, over the model's own
sampling settings (``generation_defaults.py``), over that surface's defaults (OpenAI's
temperature 1; the server's --max-tokens-limit and speculation options).
A completion with a non-empty ``suffix`` is fill-in-the-middle: ``prompt`` is the text before
the hole and the prompt is built in the model's own FIM format (``fim.py``); a model without
FIM tokens gets a 400 naming ``suffix``. OpenAI's accounting fields are checked in
``openai_fields.py``.
"""

from __future__ import annotations

from dataclasses import replace

from .. import options
from ..config import GenerationConfig, SamplingConfig, SpecConfig
from ..drafters import registry
from ..errors import ConfigError, ContextOverflowError
from ..fim import encode_fim, fim_format
from ..grammar import Grammar, check_stop, from_response_format
from ..logprobs import MAX_TOP
from ..prompt import MEDIA_ELSEWHERE, check_context, encode_prediction, encode_prompt
from ..worker import GenRequest
from . import openai_fields
from .errors import ModelNotFoundError, RequestError
from .schemas import (ChatCompletionRequest, ChatMessage, CompletionRequest, GenerationFields,
                      MediaPart, Prediction)
from .state import ServerState
from .tools import chat_tools, message_fields, tool_grammar, tool_prompt


def chat_request(body: ChatCompletionRequest, state: ServerState) -> GenRequest:
    _check_common(body, state)
    openai_fields.check_chat(body)
    if not body.messages:
        raise RequestError("messages must contain at least one message", "messages")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    configs = _configs(body, state, max_tokens, param)
    tools = chat_tools(body, state)
    messages = [_message(m, i, state) for i, m in enumerate(body.messages)]
    ids = _encode(tool_prompt(messages, tools, state) or messages, state, "messages")
    grammar = tool_grammar(tools, _grammar(body), state)
    check_stop(grammar, configs[0].stop)
    return GenRequest(ids, *configs, prediction=_prediction(body.prediction, state),
                      logprobs=_chat_logprobs(body), grammar=grammar, record=body.store is not False)


def _chat_logprobs(body: ChatCompletionRequest) -> int | None:
    """The alternatives per token the engine reports (None: no logprobs)."""
    top = body.top_logprobs
    if top is not None and not 0 <= top <= MAX_TOP:
        raise RequestError(f"top_logprobs must be an integer in [0, {MAX_TOP}], got {top}",
                           "top_logprobs")
    if not body.logprobs:
        if top:
            raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
        return None
    return top or 0


def _prediction(p: Prediction | None, state: ServerState) -> tuple[int, ...] | None:
    """The predicted output's token ids (drafted first: ``prediction.with_prediction``)."""
    if p is None:
        return None
    if p.type != "content":
        raise RequestError(f"prediction.type must be 'content' (the only type), got {p.type!r}",
                           "prediction.type")
    return encode_prediction(state.target.tokenizer, p.model_dump())


def completion_request(body: CompletionRequest, state: ServerState) -> GenRequest:
    _check_common(body, state)
    if body.echo:
        raise RequestError("echo=true is not supported; the response holds only the new text", "echo")
    if body.best_of not in (None, 1):
        raise RequestError(f"best_of must be 1 (one completion per request), got {body.best_of}", "best_of")
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise RequestError(f"prompt must be one string; a batch of {len(prompt)} prompts is not "
                               "supported (send one request each)", "prompt")
        prompt = prompt[0]
    elif isinstance(prompt, list):
        vocab = state.target.args.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"prompt token ids must be in [0, {vocab}), got {bad[0]}", "prompt")
    generation, *configs = _configs(body, state, body.max_tokens, "max_tokens")
    if body.logprobs is not None and not 0 <= body.logprobs <= MAX_TOP:
        raise RequestError(f"logprobs must be an integer in [0, {MAX_TOP}] (the alternatives per "
                           f"token), got {body.logprobs}", "logprobs")
    grammar = _grammar(body)
    check_stop(grammar, generation.stop)  # the request's own stop strings, not FIM's
    if body.suffix:
        prompt, generation = _fill_in_the_middle(prompt, body.suffix, generation, state)
    return GenRequest(_encode(prompt, state, "prompt"), generation, *configs,
                      logprobs=body.logprobs, grammar=grammar)


def _fill_in_the_middle(prefix, suffix: str, generation: GenerationConfig,
                        state: ServerState) -> tuple[list[int], GenerationConfig]:
    """The FIM prompt's ids (``fim.py``: the model's own format; a 400 naming ``suffix`` when
    it has none) and the generation stopping where the family's middle ends."""
    if not isinstance(prefix, str):
        raise RequestError("with suffix, prompt must be text (the code before the hole), not "
                           "token ids", "prompt")
    tokenizer = state.target.tokenizer
    try:
        ids = encode_fim(tokenizer, prefix, suffix, state.model_name)
    except ConfigError as e:
        raise RequestError(str(e), "suffix") from None
    stop = fim_format(tokenizer).stop
    return ids, replace(generation, stop=generation.stop + stop) if stop else generation


def _grammar(body: ChatCompletionRequest | CompletionRequest) -> Grammar | None:
    """The grammar of ``response_format`` (a ``GrammarError``, a 400 naming the field, when
    it is malformed or the schema cannot be enforced)."""
    rf = body.response_format
    return from_response_format(None if rf is None else rf.model_dump(by_alias=True,
                                                                       exclude_none=True))


def _check_common(body: GenerationFields, state: ServerState) -> None:
    if body.model is not None and body.model not in state.names:
        raise ModelNotFoundError(f"model {body.model!r} is not served here; this server serves "
                                 f"{', '.join(repr(n) for n in state.listed_names)}", "model")
    if body.n not in (None, 1):
        raise RequestError(f"n must be 1 (one choice per request), got {body.n}", "n")
    openai_fields.check_common(body)


def _configs(body: GenerationFields, state: ServerState, max_tokens: int | None,
             param: str) -> tuple[GenerationConfig, SamplingConfig, SpecConfig]:
    limit = state.settings.max_tokens_limit
    if max_tokens is not None and max_tokens > limit:
        raise RequestError(f"{param} is {max_tokens} but this server allows at most {limit} "
                           "(--max-tokens-limit)", param)
    sent = options.values("request", dict(body), model=state.sampling)
    sent["max_tokens"] = limit if max_tokens is None else max_tokens
    generation = options.config(GenerationConfig, sent)
    return generation, options.config(SamplingConfig, sent), _spec(sent, state)


def _spec(sent: dict, state: ServerState) -> SpecConfig:
    method = sent.pop("method", None) or state.method
    try:
        entry = registry.get(method)
    except ConfigError as e:  # the registry's message: the name and every method it knows
        raise RequestError(str(e), "method") from None
    if method not in state.methods:
        needs = " (it needs a draft model: start the server with --draft REF)" if (
            entry.needs_draft) else ""
        if entry.needs_head:
            needs = (f" (it needs a trained {method} head for model {state.model_name}: make one "
                     f"with `edgespec train {method}`, then start the server with --head DIR)")
        if entry.needs_mtp:
            needs = (f" (it needs the checkpoint's own multi-token-prediction layer, mtp.* "
                     f"weights, and model {state.model_name} has none)")
        raise RequestError(f"method {method!r} is not available on this server{needs}; "
                           f"available: {', '.join(state.methods)}", "method")
    return state.settings.spec(method, sent)


def _message(m: ChatMessage, i: int, state: ServerState) -> dict:
    if m.content is None:
        content = ""
    elif isinstance(m.content, str):
        content = m.content
    else:
        for j, part in enumerate(m.content):
            if isinstance(part, MediaPart):
                raise RequestError(f"messages[{i}].content[{j}] has type {part.type!r}, not "
                                   f"text ({state.model_name} is served as a text model); "
                                   f"{MEDIA_ELSEWHERE}", f"messages.{i}.content.{j}")
        content = "\n".join(part.text for part in m.content)
    return {"role": "system" if m.role == "developer" else m.role, "content": content,
            **message_fields(m)}


def _encode(prompt, state: ServerState, param: str) -> list[int]:
    ids = encode_prompt(state.target.tokenizer, prompt)
    try:
        check_context(ids, state.target.context_length, state.model_name, param)
    except ContextOverflowError as err:
        err.param = param  # errors.py reports it as the OpenAI error's "param"
        raise
    return ids
