"""ASGI middleware that answers before any route runs: the Host check, the API key, the body
size limit.

Contract: ``ApiKeyGuard`` answers 401 to a ``/v1/...`` request without ``Authorization: Bearer
KEY`` (CORS preflights pass: browsers send them without credentials). ``BodyLimit`` reads the
whole body first (it is small: at most the limit) and answers 413 when it is over the limit,
draining up to ``_DRAIN_FACTOR`` times the limit so the client can read the answer; the route
then gets the body replayed. ``HostGuard`` answers 403 to a request whose ``Host`` header
names none of the server's own names (``host_names``): a web page whose domain an attacker
rebinds to 127.0.0.1 sends its own domain as Host, so it cannot drive the local model
(DNS rebinding, as in CVE-2024-28224). All answer with ``errors.error_response``, OpenAI's shape.
"""

from __future__ import annotations

import hmac
import ipaddress

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import AuthError, HostNotAllowedError, RequestTooLargeError, error_response

_DRAIN_FACTOR = 16  # beyond this much the connection is just closed after the 413


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
WILDCARD_BINDS = ("0.0.0.0", "[::]", "")


def host_name(host: str) -> str:
    """The name part of a Host header or an address, lower case, without port or final dot;
    IPv6 literals in brackets (``[::1]:8080`` and ``::1`` are both ``[::1]``)."""
    h = host.strip().lower()
    if h.startswith("["):
        h = h[: h.find("]") + 1] if "]" in h else h
    elif h.count(":") == 1:
        h = h.split(":")[0]
    elif ":" in h:
        h = f"[{h}]"  # a bare IPv6 address (a bind address; no valid Host header is one)
    return h.rstrip(".")


def host_names(bind: str, allowed: tuple[str, ...] = ()) -> frozenset[str]:
    """The names a request's Host may use: loopback's, the bind address, ``allowed``."""
    return frozenset({*LOOPBACK_NAMES, host_name(bind), *(host_name(a) for a in allowed)})


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
        return True
    except ValueError:
        return False


class HostGuard:
    """403 unless Host names the server: one of ``names``; with a wildcard bind (0.0.0.0, ::)
    any IP address too (an address cannot be rebound: DNS rebinding needs a name); ``"*"`` in
    ``names`` turns the check off. A request without Host (HTTP/1.0; browsers always send
    one) passes."""

    def __init__(self, app: ASGIApp, names: frozenset[str], bind: str):
        self.app = app
        self.names = names
        self.any_ip = host_name(bind) in WILDCARD_BINDS

    def allows(self, host: str | None) -> bool:
        if host is None or "*" in self.names:
            return True
        name = host_name(host)
        return name in self.names or (self.any_ip and _is_ip(name))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = Headers(scope=scope).get("host")
            if not self.allows(host):
                error = HostNotAllowedError(
                    f"Host {host!r} is not a name of this server (allowed: "
                    f"{', '.join(sorted(self.names))}); start it with --allowed-host NAME to "
                    "serve requests that name it so")
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


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
