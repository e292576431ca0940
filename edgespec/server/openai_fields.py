"""OpenAI's request fields that edgespec takes only with some values, checked as OpenAI checks them.

Contract: ``check_common`` (both endpoints) and ``check_chat`` (chat only) return nothing or
raise ``RequestError`` naming the field, its value and what is accepted. These fields change
nothing about generation: ``user``, ``safety_identifier``, ``metadata`` (OpenAI's limits: 16
pairs, keys up to 64 characters, values up to 512) and ``prompt_cache_key`` are accepted and
recorded nowhere; ``store``, ``service_tier``, ``prompt_cache_retention``, ``modalities``,
``logit_bias`` and ``stream_options.include_obfuscation`` are accepted with the values that
describe what this server does anyway, and refused with any other (never silently ignored).
"""

from __future__ import annotations

from .errors import RequestError

METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512
SERVICE_TIERS = ("auto", "default")


def check_common(body) -> None:
    """The fields of ``_OpenAIFields``: ``logit_bias``, ``stream_options`` (only when streaming,
    as OpenAI rules), ``stream_options.include_obfuscation``."""
    if body.logit_bias:
        raise RequestError("logit_bias is not supported by this server (only {} is accepted); "
                           "use stop, a grammar (response_format) or edit the prompt", "logit_bias")
    if body.stream_options is not None and not body.stream:
        raise RequestError("stream_options is only allowed with stream: true", "stream_options")
    if body.stream_options is not None and body.stream_options.include_obfuscation:
        raise RequestError("stream_options.include_obfuscation must be false: this server adds no "
                           "obfuscation padding to its chunks", "stream_options.include_obfuscation")


def check_chat(body) -> None:
    """The accounting and routing fields of a chat request (``schemas._ChatOpenAIFields``)."""
    _check_metadata(body.metadata)
    if body.store:
        raise RequestError("store must be false or left out: this server keeps no completions to "
                           "retrieve (false also keeps the request out of the recordings for "
                           "learning)", "store")
    if body.service_tier is not None and body.service_tier not in SERVICE_TIERS:
        raise RequestError(f"service_tier must be one of {', '.join(map(repr, SERVICE_TIERS))} "
                           f"(every request is served the same way), got {body.service_tier!r}",
                           "service_tier")
    if body.prompt_cache_retention not in (None, "in_memory"):
        raise RequestError(f"prompt_cache_retention must be 'in_memory' (the last request's KV is "
                           f"kept in memory, nothing longer), got {body.prompt_cache_retention!r}",
                           "prompt_cache_retention")
    if body.modalities is not None and body.modalities != ["text"]:
        raise RequestError(f"modalities must be ['text'] (edgespec answers in text only), got "
                           f"{body.modalities!r}", "modalities")


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > METADATA_PAIRS:
        raise RequestError(f"metadata may have at most {METADATA_PAIRS} key-value pairs, got "
                           f"{len(metadata)}", "metadata")
    for key, value in metadata.items():
        if len(key) > METADATA_KEY:
            raise RequestError(f"metadata keys may have at most {METADATA_KEY} characters, got "
                               f"{key[:20]!r}... ({len(key)})", "metadata")
        if len(value) > METADATA_VALUE:
            raise RequestError(f"metadata[{key!r}] may have at most {METADATA_VALUE} characters, "
                               f"got {len(value)}", f"metadata.{key}")
