"""The FastAPI app: OpenAI-compatible routes over one ``ServerState``.

Contract: ``create_app(state)`` serves ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models``, ``GET /health`` (JSON: the worker's queue, active requests, limits, counts,
tokens/s, acceptance per method, prefix cache hits; 503 once the worker has stopped) and
``GET /metrics`` (the same in the Prometheus text format, ``edgespec/metrics.py``). A request is
validated and encoded on arrival (``convert``), checked against the KV budget (413), queued to
the worker (429 with ``Retry-After`` when the queue is full), and answered as one JSON body or
as server-sent events (OpenAI chunks, a usage chunk when ``stream_options.include_usage``, then ``[DONE]``).
Every exception, whatever raised it, is answered through ``errors.error_response``. A request
whose Host header is not one of the server's names gets 403 before anything else runs
(``middleware.HostGuard``); browsers get CORS headers only for the ``--cors-origin`` origins. A client that
goes away cancels its job (streaming: when the response ends for any reason; non-streaming: the
handler polls for the disconnect), so the worker skips or stops it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from .. import __version__
from ..engine import Step
from ..errors import EdgespecError
from ..worker import Done, Failed, GenRequest, LoopJob, Worker
from . import convert
from .errors import UnavailableError, error_response, error_status_and_body
from .middleware import ApiKeyGuard, BodyLimit, HostGuard, host_names
from .logprob_format import LogprobFormat
from .responses import DONE, KEEP_ALIVE, ChatFormat, CompletionFormat, sse
from .schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ErrorResponse,
    Health,
    ModelList,
)
from .state import ServerState
from .tools import chat_calls

_DISCONNECT_S = 0.25  # how often a non-streamed request's client is checked while steps flow
_ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 413, 429, 500, 503)}
_ERRORS[429]["headers"] = {"Retry-After": {"description": "seconds to wait before retrying",
                                           "schema": {"type": "integer"}}}
_PROMETHEUS = {"content": {"text/plain": {"schema": {"type": "string"}}},
               "description": "Prometheus text format 0.0.4"}
# With "stream": true a 200 is a server-sent event stream; its schema describes one event (as
# OpenAPI 3.2 reads text/event-stream): a JSON chunk, or "[DONE]", in ``data``.
_SSE_EVENT = {"type": "object", "required": ["data"],
              "properties": {"data": {"type": "string"}, "event": {"type": "string"},
                             "id": {"type": "string"}, "retry": {"type": "integer"}}}
_SSE = {"content": {"text/event-stream": {"schema": _SSE_EVENT}}}


def create_app(state: ServerState) -> FastAPI:
    """The ASGI app serving ``state``'s model (the state is started and stopped by its owner)."""
    app = FastAPI(title="edgespec", version=__version__, strict_content_type=False,
                  description="OpenAI-compatible endpoint for speculative decoding with edgespec.")
    for exc_type in (Exception, EdgespecError, HTTPException, RequestValidationError):
        app.add_exception_handler(exc_type, lambda request, exc: error_response(exc))
    s = state.settings
    app.add_middleware(BodyLimit, max_bytes=s.max_body_bytes)
    if s.api_key:
        app.add_middleware(ApiKeyGuard, api_key=s.api_key)
    if s.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(s.cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"])
    # added last, so it runs first: a request for another Host gets nothing else, not even CORS
    app.add_middleware(HostGuard, names=host_names(s.host, s.allowed_hosts), bind=s.host)
    _add_routes(app, state)
    app.openapi = lambda: _openapi(app, bool(s.api_key))
    return app


def _add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health", response_model=Health, responses={503: {"model": Health}})
    async def health() -> JSONResponse:
        w, s = state.worker, state.settings
        active = w.active
        body = {"status": "ok" if w.alive else "stopped", "model": state.model_name,
                "method": state.method, "methods": list(state.methods), "queued": w.queued,
                "busy": active > 0, "active": active, **w.counts,
                "max_concurrency": s.max_concurrency, "max_queue": s.max_queue,
                "kv_budget_mb": s.kv_budget_mb}
        if state.metrics is not None:
            snap = state.metrics.snapshot()
            body |= {"tokens_per_s": snap["tokens_per_s"], "prefix_cache": snap["prefix_cache"],
                     "acceptance": {m: v["acceptance"] for m, v in snap["methods"].items()}}
        return JSONResponse(body, status_code=200 if w.alive else 503)

    @app.get("/metrics", response_class=Response, responses={200: _PROMETHEUS})
    async def metrics() -> Response:
        """The worker's counters in the Prometheus text format."""
        if state.metrics is None:
            raise UnavailableError("this server keeps no metrics")
        state.metrics.queue(state.worker.queued, state.worker.active)  # read when scraped
        body, content_type = state.metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> dict:
        return {"object": "list", "data": [
            {"id": n, "object": "model", "created": state.created, "owned_by": "edgespec"}
            for n in state.listed_names]}

    @app.post("/v1/chat/completions", response_model=ChatCompletion,
              responses={**_ERRORS, 200: _SSE})
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        gen = await run_in_threadpool(convert.chat_request, body, state)  # encoding: off the loop
        state.check_kv_budget(gen)
        fmt = ChatFormat(state.model_name, _include_usage(body), _logprobs(gen, state))
        fmt.calls = chat_calls(body, state)
        return await _answer(request, state.worker, gen, fmt, bool(body.stream))

    @app.post("/v1/completions", response_model=Completion, responses={**_ERRORS, 200: _SSE})
    async def completions(body: CompletionRequest, request: Request) -> Response:
        gen = await run_in_threadpool(convert.completion_request, body, state)
        state.check_kv_budget(gen)
        fmt = CompletionFormat(state.model_name, _include_usage(body), _logprobs(gen, state))
        return await _answer(request, state.worker, gen, fmt, bool(body.stream))


def _logprobs(gen: GenRequest, state: ServerState) -> LogprobFormat | None:
    return None if gen.logprobs is None else LogprobFormat(state.target.tokenizer)


def _include_usage(body) -> bool:
    return bool(body.stream and body.stream_options and body.stream_options.include_usage)


async def _answer(request: Request, worker: Worker, gen: GenRequest, fmt, stream: bool) -> Response:
    job = worker.submit(LoopJob(gen, asyncio.get_running_loop()))
    if stream:
        return _EventStream(job, _stream_events(job, worker, fmt))
    try:
        parts: list[str] = []
        lps: list = []
        async for event in _events(job, worker, request):
            if isinstance(event, Step):
                parts.append(event.text)
                lps.extend(event.logprobs or ())
            elif isinstance(event, Done):
                return JSONResponse(fmt.full("".join(parts), event.finish_reason, event.stats,
                                             lps))
            elif isinstance(event, Failed):
                raise event.error
        return Response(status_code=499)  # the client has gone; nobody reads this
    finally:
        job.cancel()  # no-op once Done; otherwise the worker skips or stops the job


async def _events(job: LoopJob, worker: Worker, request: Request | None = None) -> AsyncIterator:
    """The job's events up to the terminal one; ``None`` for each tick spent waiting.

    Returns early if ``request``'s client disconnects (checked on every idle tick, and every
    ``_DISCONNECT_S`` while steps flow, so a gone client frees its place in the batch soon);
    raises ``UnavailableError`` if the worker stops without answering, so no handler waits
    forever.
    """
    checked = time.monotonic()
    async for event in worker.events(job):
        if request is not None and (event is None or time.monotonic() - checked >= _DISCONNECT_S):
            checked = time.monotonic()
            if await request.is_disconnected():
                return
        yield event

async def _stream_events(job: LoopJob, worker: Worker, fmt) -> AsyncIterator[str]:
    opening = fmt.opening()
    if opening is not None:
        yield sse(opening)
    try:
        async for event in _events(job, worker):
            if event is None:
                yield KEEP_ALIVE  # fails on a closed socket, which ends (and cancels) the job
            elif isinstance(event, Step):
                if event.text or event.logprobs:
                    yield sse(fmt.delta(event.text, event.logprobs))
            elif isinstance(event, Done):
                yield sse(fmt.closing(event.finish_reason))
                if fmt.include_usage:
                    yield sse(fmt.usage_chunk(event.stats))
            else:
                yield sse(error_status_and_body(event.error)[1])
    except UnavailableError as e:
        yield sse(error_status_and_body(e)[1])
    yield DONE


class _EventStream(StreamingResponse):
    """Server-sent events whose job is cancelled however the response ends (done, error, hang-up)."""

    def __init__(self, job: LoopJob, content: AsyncIterator[str]):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


def _openapi(app: FastAPI, with_key: bool) -> dict:
    """FastAPI's schema, corrected: validation errors are 400 (not 422); the bearer key, if any."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, description=app.description,
                             routes=app.routes)
        for path in schema.get("paths", {}).values():
            for op in path.values():
                op.get("responses", {}).pop("422", None)
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        comps.pop("HTTPValidationError", None)
        comps.pop("ValidationError", None)
        if with_key:
            schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            for name, path in schema["paths"].items():
                if name.startswith("/v1/"):
                    for op in path.values():
                        op["security"] = [{"bearer": []}]
        app.openapi_schema = schema
    return app.openapi_schema
