"""ASGI middleware that answers before any route runs: the API key and the body size limit.

Contract: ``ApiKeyGuard`` answers 401 to a ``/v1/...`` request without ``Authorization: Bearer
KEY`` (CORS preflights pass: browsers send them without credentials). ``BodyLimit`` reads the
whole body first (it is small: at most the limit) and answers 413 when it is over the limit,
draining up to ``_DRAIN_FACTOR`` times the limit so the client can read the answer; the route
then gets the body replayed. Both answer with ``errors.error_response``, OpenAI's shape.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import AuthError, RequestTooLargeError, error_response

_DRAIN_FACTOR = 16  # beyond this much the connection is just closed after the 413


class ApiKeyGuard:
    def __init__(self, app: ASGIApp, api_key: str, prefix: str = "/v1"):
        self.app = app
        self.key = api_key.encode()
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["method"] != "OPTIONS"
                and scope["path"].startswith(self.prefix)):
            scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                error = AuthError("missing API key: send the header 'Authorization: Bearer KEY' "
                                  "with the key the server was started with (--api-key)")
            elif not hmac.compare_digest(token.strip().encode(), self.key):
                error = AuthError("incorrect API key provided")
            else:
                error = None
            if error is not None:
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks, size, more = [], 0, True
        while more and size <= self.max_bytes * _DRAIN_FACTOR:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body: nobody to answer
            body = message.get("body", b"")
            size += len(body)
            if size <= self.max_bytes:
                chunks.append(body)
            more = message.get("more_body", False)
        if size > self.max_bytes:
            error = RequestTooLargeError(f"request body is over the limit of {self.max_bytes} bytes")
            await error_response(error)(scope, receive, send)
            return
        replay: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)
