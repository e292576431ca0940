"""OpenAI request bodies -> validated generation requests for the worker.

Contract: ``chat_request`` / ``completion_request`` either return a ``GenRequest`` the engine
will accept (token ids within the context window, config objects built) or raise a typed error
that ``errors.py`` maps to a 4xx: ``ModelNotFoundError`` for a model name the server does not
serve, ``RequestError`` for an unsupported field value, ``ConfigError`` (from the config
dataclasses, message unchanged) for a bad sampling / stop / method value,
``ContextOverflowError`` for a prompt that does not fit. Encoding happens here, on the request's
thread, so a bad request is answered at once rather than after the queue. The generated fields
(``options.SURFACES["request"]``) become configs through ``options``, with that surface's
defaults (OpenAI's temperature 1; the server's --max-tokens-limit and speculation options).
"""

from __future__ import annotations

from .. import options
from ..config import GenerationConfig, SamplingConfig, SpecConfig
from ..drafters import registry
from ..errors import ConfigError, ContextOverflowError
from ..prompt import check_context, encode_prompt
from ..worker import GenRequest
from .errors import ModelNotFoundError, RequestError
from .schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, GenerationFields
from .state import ServerState


def chat_request(body: ChatCompletionRequest, state: ServerState) -> GenRequest:
    _check_common(body, state)
    if not body.messages:
        raise RequestError("messages must contain at least one message", "messages")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    configs = _configs(body, state, max_tokens, param)
    ids = _encode([_message(m) for m in body.messages], state, "messages")
    return GenRequest(ids, *configs)


def completion_request(body: CompletionRequest, state: ServerState) -> GenRequest:
    _check_common(body, state)
    if body.echo:
        raise RequestError("echo=true is not supported; the response holds only the new text", "echo")
    if body.suffix:
        raise RequestError("suffix (fill-in-the-middle) is not supported; put the text in the prompt",
                           "suffix")
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
    configs = _configs(body, state, body.max_tokens, "max_tokens")
    return GenRequest(_encode(prompt, state, "prompt"), *configs)


def _check_common(body: GenerationFields, state: ServerState) -> None:
    if body.model is not None and body.model not in state.names:
        raise ModelNotFoundError(f"model {body.model!r} is not served here; this server serves "
                                 f"{', '.join(repr(n) for n in state.listed_names)}", "model")
    if body.n not in (None, 1):
        raise RequestError(f"n must be 1 (one choice per request), got {body.n}", "n")


def _configs(body: GenerationFields, state: ServerState, max_tokens: int | None,
             param: str) -> tuple[GenerationConfig, SamplingConfig, SpecConfig]:
    limit = state.settings.max_tokens_limit
    if max_tokens is not None and max_tokens > limit:
        raise RequestError(f"{param} is {max_tokens} but this server allows at most {limit} "
                           "(--max-tokens-limit)", param)
    sent = options.values("request", dict(body))
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
        raise RequestError(f"method {method!r} is not available on this server{needs}; "
                           f"available: {', '.join(state.methods)}", "method")
    return state.settings.spec(method, sent)


def _message(m: ChatMessage) -> dict:
    if m.content is None:
        content = ""
    elif isinstance(m.content, str):
        content = m.content
    else:
        content = "\n".join(part.text for part in m.content)
    return {"role": "system" if m.role == "developer" else m.role, "content": content}


def _encode(prompt, state: ServerState, param: str) -> list[int]:
    ids = encode_prompt(state.target.tokenizer, prompt)
    try:
        check_context(ids, state.target.context_length, state.model_name, param)
    except ContextOverflowError as err:
        err.param = param  # errors.py reports it as the OpenAI error's "param"
        raise
    return ids
