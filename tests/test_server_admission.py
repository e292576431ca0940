"""Admission and limits of ``edgespec serve``: 429 with Retry-After when the queue is full, 413
for a request whose KV cache cannot fit the budget, ``/health`` and ``/metrics`` (Prometheus
text), and the settings and flags behind them.

The server (``live_server.py``) runs on a uvicorn thread over a tiny random model with a long
context window and a 1 MiB KV budget (2,048 tokens of this model's KV) and a max_tokens limit
that fits it (a request that sets none asks for the limit).
"""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from edgespec.errors import ConfigError, QueueFullError
from edgespec.kv_budget import kv_bytes_per_token
from edgespec.server import ServerSettings, convert
from edgespec.server.cli import serve
from edgespec.server.schemas import CompletionRequest
from edgespec.worker import Call, ThreadJob

from .live_server import LiveServer, assert_error

BUDGET_MB = 1
LIMIT = 2000


@pytest.fixture(scope="module")
def long_model(tiny_models):
    return tiny_models.path(context=8192, tie=False)


@pytest.fixture(scope="module")
def live(long_model):
    srv = LiveServer(ServerSettings(model=str(long_model), max_tokens_limit=LIMIT,
                                    kv_budget_mb=BUDGET_MB, max_concurrency=3, max_queue=5))
    yield srv
    srv.stop()


def _complete(srv: LiveServer, max_tokens: int, prompt="the cat sat") -> httpx.Response:
    return httpx.post(srv.url + "/v1/completions", timeout=60, json={
        "model": srv.state.model_name, "prompt": prompt, "max_tokens": max_tokens,
        "temperature": 0})


def _samples(srv: LiveServer) -> dict[tuple, float]:
    r = httpx.get(srv.url + "/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


# -- the queue -----------------------------------------------------------------------------------

def test_full_queue_is_429_with_retry_after(live, monkeypatch):
    """What the server answers when the worker refuses a job (its queue is full)."""
    def full(job):
        raise QueueFullError("the queue is full (5 requests waiting, --max-queue 5); retry later",
                             retry_after=7)

    monkeypatch.setattr(live.state.worker, "submit", full)
    r = _complete(live, 4)
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert r.json() == {"error": {"message": "the queue is full (5 requests waiting, --max-queue "
                                  "5); retry later", "type": "requests", "param": None,
                                  "code": "rate_limit_exceeded"}}
    r = httpx.post(live.url + "/v1/chat/completions", timeout=60, json={
        "model": live.state.model_name, "messages": [{"role": "user", "content": "hi"}],
        "stream": True})
    assert r.status_code == 429 and r.headers["retry-after"] == "7"  # refused before streaming
    with pytest.raises(openai.RateLimitError):  # the official client reads it as a rate limit
        live.client().completions.create(model=live.state.model_name, prompt="x", max_tokens=2)
    assert QueueFullError("x", retry_after=0).retry_after == 1  # never "retry after 0 seconds"


def test_a_real_full_queue_is_429(long_model):
    """max_queue 1: the worker's thread held by a call, one request waiting, the next refused."""
    srv = LiveServer(ServerSettings(model=str(long_model), max_concurrency=1, max_queue=1))
    worker, started, release = srv.state.worker, threading.Event(), threading.Event()
    try:
        worker.submit(ThreadJob(Call(lambda engine: (started.set(), release.wait(60)))))
        assert started.wait(60)
        body = CompletionRequest(model=srv.state.model_name, prompt="the cat", max_tokens=2)
        waiting = worker.submit(ThreadJob(convert.completion_request(body, srv.state)))
        r = _complete(srv, 2)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert srv.health()["queued"] == 1
        release.set()
        assert [type(e).__name__ for e in worker.events_blocking(waiting)][-1] == "Done"
        assert _complete(srv, 2).status_code == 200  # room again
    finally:
        release.set()
        srv.stop()


# -- the KV budget -------------------------------------------------------------------------------

def test_a_request_over_the_kv_budget_is_413_naming_the_numbers(live):
    """prompt + max_tokens over the budget's 2,048 tokens, each within its own limit."""
    per_token = kv_bytes_per_token(live.state.target)
    fits = (BUDGET_MB << 20) // per_token
    assert fits == 2048 and LIMIT < fits
    prompt = [7] * (fits - LIMIT + 1)  # token ids: exactly one token too many
    err = assert_error(_complete(live, LIMIT, prompt), 413, param="max_tokens",
                       code="request_too_large")
    msg = err["message"]
    assert f"the prompt ({len(prompt)} tokens) + max_tokens ({LIMIT})" in msg
    assert f"{per_token} bytes per token" in msg
    assert f"KV budget is {BUDGET_MB} MiB (--kv-budget-mb)" in msg
    assert _complete(live, 2, prompt).status_code == 200  # the same prompt with fewer tokens
    r = httpx.post(live.url + "/v1/chat/completions", timeout=60, json={
        "model": live.state.model_name, "messages": [{"role": "user", "content": "hi " * 80}]})
    assert_error(r, 413, code="request_too_large")  # no max_tokens: it asks for the limit


def test_a_server_whose_default_request_cannot_fit_does_not_start(long_model):
    with pytest.raises(ConfigError, match=r"--max-tokens-limit 4000 .* over --kv-budget-mb 1: "
                                          r"raise --kv-budget-mb to at least 2"):
        LiveServer(ServerSettings(model=str(long_model), max_tokens_limit=4000, kv_budget_mb=1))


# -- /health and /metrics ------------------------------------------------------------------------

def test_health_reports_queue_limits_and_rates(live):
    assert _complete(live, 6).status_code == 200
    h = live.health()
    assert h["status"] == "ok" and h["queued"] == 0 and h["active"] == 0 and h["busy"] is False
    assert (h["max_concurrency"], h["max_queue"], h["kv_budget_mb"]) == (3, 5, BUDGET_MB)
    assert h["served"] >= 1 and h["tokens_per_s"] >= 0  # > 0 only within 10 s of a step
    assert set(h["prefix_cache"]) == {"lookups", "hits", "hit_tokens", "prompt_tokens", "hit_rate"}
    assert isinstance(h["acceptance"], dict)
    assert live.state.method in h["acceptance"]  # the worker counted the request it served


def test_metrics_is_prometheus_text(live):
    before = _samples(live)
    assert before[("edgespec_queue_waiting", ())] == 0
    assert before[("edgespec_requests_active", ())] == 0
    method = live.state.method
    key = ("edgespec_requests_finished_total", (("method", method), ("reason", "length")))
    tokens = ("edgespec_generated_tokens_total", (("method", method),))
    assert _complete(live, 5).status_code == 200
    after = _samples(live)
    assert after[key] == before.get(key, 0) + 1
    assert after[tokens] == before.get(tokens, 0) + 5


def test_health_and_metrics_are_in_the_openapi_schema(live):
    schema = httpx.get(live.url + "/openapi.json").json()
    assert "text/plain" in schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    health = schema["components"]["schemas"]["Health"]["properties"]
    assert {"queued", "active", "max_concurrency", "max_queue", "kv_budget_mb", "tokens_per_s",
            "acceptance", "prefix_cache"} <= set(health)
    r429 = schema["paths"]["/v1/completions"]["post"]["responses"]["429"]
    assert "Retry-After" in r429["headers"]


# -- the settings and the flags ------------------------------------------------------------------

@pytest.mark.parametrize("name, value", [("max_concurrency", 0), ("max_queue", -1),
                                         ("kv_budget_mb", 0), ("max_concurrency", True),
                                         ("kv_budget_mb", 1.5)])
def test_bad_limits_are_config_errors_naming_the_value(name, value):
    with pytest.raises(ConfigError, match=rf"{name} must be an integer >= \d, got {value!r}"):
        ServerSettings(**{name: value})


def test_serve_help_states_the_limits_and_rejects_bad_ones():
    runner = CliRunner()
    out = " ".join(runner.invoke(serve, ["--help"]).output.split())
    for flag in ("--max-concurrency", "--max-queue", "--kv-budget-mb"):
        assert flag in out
    assert "default: 4" in out and "default: 64" in out and "default: 2048" in out
    assert "429" in out and "413" in out
    r = runner.invoke(serve, ["--model", "x", "--max-concurrency", "0", "--port", "0"])
    assert r.exit_code == 2 and "max_concurrency must be an integer >= 1, got 0" in r.output
