"""Every error the server answers with, mapped from its exception *type* in this one place.

Contract: ``error_response(exc)`` turns any exception into an HTTP status and OpenAI's error
body ``{"error": {"message", "type", "param", "code"}}``. Client mistakes (bad JSON, wrong types,
values the config dataclasses reject, a prompt beyond the context window, an unknown model, a
missing key, an oversize body, a field the server does not take, a Host that is not the
server's) are 4xx with a message naming the bad value. A full queue is 429 with ``Retry-After``
and OpenAI's rate-limit body (type "requests", code "rate_limit_exceeded"); a request whose
KV cache cannot fit the server's budget is 413. Anything unexpected is
a 500 whose message says only that, so a request can never take the server down or leak a trace.
"""

from __future__ import annotations

import logging

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..errors import (ConfigError, ContextOverflowError, EdgespecError, QueueFullError,
                      UnavailableError)
from .request_model import NOT_SUPPORTED

log = logging.getLogger("edgespec.server")


class RequestError(EdgespecError, ValueError):
    """A request field has a value this server does not accept (beyond the config checks)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class AuthError(EdgespecError):
    """The API key is missing or wrong (only when the server was started with --api-key)."""


class ModelNotFoundError(RequestError):
    """The request's ``model`` names neither the served model nor one of its aliases."""


class RequestTooLargeError(EdgespecError):
    """The request body is over the server's size limit, or the request's prompt + max_tokens
    need more KV cache than the server's whole KV budget (``param`` names the field)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class HostNotAllowedError(EdgespecError):
    """The request's Host header is none of the server's own names (``middleware.HostGuard``)."""


# (exception type, HTTP status, OpenAI error type, code); the first matching row wins, so
# subclasses come before their bases.
_TABLE: tuple[tuple[type[BaseException], int, str, str | None], ...] = (
    (AuthError, 401, "invalid_request_error", "invalid_api_key"),
    (ModelNotFoundError, 404, "invalid_request_error", "model_not_found"),
    (RequestTooLargeError, 413, "invalid_request_error", "request_too_large"),
    (HostNotAllowedError, 403, "invalid_request_error", "host_not_allowed"),
    (QueueFullError, 429, "requests", "rate_limit_exceeded"),  # OpenAI's requests-per-minute 429
    (ContextOverflowError, 400, "invalid_request_error", "context_length_exceeded"),
    (RequestError, 400, "invalid_request_error", None),
    (ConfigError, 400, "invalid_request_error", None),
    (RequestValidationError, 400, "invalid_request_error", None),
    (UnavailableError, 503, "server_error", "unavailable"),
    (EdgespecError, 500, "server_error", None),
)


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_status_and_body(exc: BaseException) -> tuple[int, dict]:
    """The HTTP status and OpenAI error body for ``exc``."""
    if isinstance(exc, HTTPException):  # routing: unknown path (404), wrong method (405)
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return exc.status_code, error_body(str(exc.detail), kind)
    for cls, status, kind, code in _TABLE:
        if isinstance(exc, cls):
            if isinstance(exc, RequestValidationError):
                return status, error_body(*_describe_validation(exc), code=code)
            return status, error_body(str(exc), kind, exc.param, code)
    log.error("unexpected error while serving a request", exc_info=exc)
    return 500, error_body(f"internal server error ({type(exc).__name__}); see the server log",
                           "server_error")


def error_response(exc: BaseException) -> JSONResponse:
    status, body = error_status_and_body(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if isinstance(exc, QueueFullError):
        headers = {"Retry-After": str(exc.retry_after)}
    return JSONResponse(body, status_code=status, headers=headers)


def _describe_validation(exc: RequestValidationError) -> tuple[str, str, str | None]:
    """(message, type, param) for pydantic's errors: one line naming the field and the problem."""
    errors = list(exc.errors())
    first = errors[0] if errors else {}
    kind = "invalid_request_error"
    if first.get("type") == "json_invalid":
        return f"request body is not valid JSON ({(first.get('ctx') or {}).get('error', '')})", kind, None
    if _field_path(first) == () and isinstance(first.get("input"), bytes):
        return "request body must be a JSON object sent with Content-Type: application/json", kind, None
    if not errors or (first.get("type") == "missing" and _field_path(first) == ()):
        return "request body is missing; send a JSON object", kind, None
    refused = [e for e in errors if e.get("type") in (NOT_SUPPORTED, "extra_forbidden")]
    if refused:  # a field the server does not take is the first thing to say
        return _describe_refused(refused[0]), kind, _refused_param(refused[0])
    # a union field reports one error per member: keep the first field's errors, name it once
    top = _field_path(first)[:1]
    errors = [e for e in errors if _field_path(e)[:1] == top]
    param = ".".join(str(p) for p in _common_prefix([_field_path(e) for e in errors])) or None
    messages = " or ".join(list(dict.fromkeys(e.get("msg", "") for e in errors))[:3])
    got = f" (got {first['input']!r:.80})" if "input" in first and first.get("type") != "missing" else ""
    return f"{param or 'request body'}: {messages}{got}", kind, param


def _refused_param(error: dict) -> str:
    path = _field_path(error)
    if error.get("type") == NOT_SUPPORTED:
        path = (*path, error["ctx"]["name"])
    return ".".join(str(p) for p in path)


def _describe_refused(error: dict) -> str:
    """The message for a field the request model does not take (``request_model.py``)."""
    param = _refused_param(error)
    if error.get("type") == NOT_SUPPORTED:
        return f"{param} is not supported by this server: {error['ctx']['why']}"
    return (f"{param}: unknown field; this endpoint's fields are listed in the server's OpenAPI "
            "schema (GET /openapi.json)")


def _field_path(error: dict) -> tuple:
    loc = tuple(error.get("loc", ()))
    return loc[1:] if loc[:1] == ("body",) else loc


def _common_prefix(paths: list[tuple]) -> tuple:
    prefix = paths[0]
    for path in paths[1:]:
        n = 0
        while n < min(len(prefix), len(path)) and prefix[n] == path[n]:
            n += 1
        prefix = prefix[:n]
    return prefix
