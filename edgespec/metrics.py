"""What the server's generation worker counts, in the Prometheus text format (``/metrics``) and
as a dict (``/health``).

Contract:
- The worker reports through the first four calls below, from its own thread (the server
  makes the fifth when ``/metrics`` is read, the one reader of those gauges); ``render`` and
  ``snapshot`` may run on any thread at the same time (prometheus_client's metrics are
  thread-safe; the tokens/s window has its own lock).
    - ``request_started(method)``: a generation was taken from the queue and starts decoding;
    - ``step(method, tokens, proposed, accepted)``: one engine step of one request committed
      ``tokens`` tokens; its drafter proposed ``proposed`` and the target kept ``accepted``;
    - ``request_finished(method, reason, stats)``: it ended ("stop", "length", "cancelled",
      "failed"), with its :class:`~edgespec.stats.Stats`;
    - ``prefix(hit_tokens, prompt_tokens)``: a prompt reused the KV of ``hit_tokens`` of its
      ``prompt_tokens`` from the prefix cache (0: a miss);
    - ``queue(queued, active)``: jobs waiting and jobs decoding now.
- Each :class:`Metrics` has its own ``CollectorRegistry`` (never the process-global one), so
  several servers, or tests, can live in one process.
- prometheus-client comes with the ``serve`` extra, not the core install: this module imports
  without it, and building a ``Metrics`` without it raises ``MissingExtraError`` naming the extra.
  The worker therefore takes ``metrics=None`` by default (the Python API counts nothing) and
  ``edgespec serve`` builds one (``server/state.py``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from .extras import missing_extra

if TYPE_CHECKING:
    from .stats import Stats

WINDOW_S = 10.0  # tokens/s in /health: the tokens committed in the last WINDOW_S seconds
# request seconds (prefill + decode, queueing not included) and time to first token
_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Metrics:
    """The counters of one worker (see the module docstring for who calls what)."""

    def __init__(self) -> None:
        try:
            import prometheus_client as p
        except ImportError as e:
            raise missing_extra("edgespec serve's /metrics", e) or e
        self.registry = r = p.CollectorRegistry(auto_describe=True)
        m = ["method"]
        self._started = p.Counter("edgespec_requests_started", "generations taken from the queue",
                                  m, registry=r)
        self._finished = p.Counter("edgespec_requests_finished", "generations ended, by finish "
                                   "reason (stop, length, cancelled, failed)", [*m, "reason"],
                                   registry=r)
        self._generated = p.Counter("edgespec_generated_tokens", "tokens generated", m, registry=r)
        self._prompt = p.Counter("edgespec_prompt_tokens", "prompt tokens of finished "
                                 "generations", m, registry=r)
        self._steps = p.Counter("edgespec_steps", "engine steps (one target forward's share of "
                                "one request)", m, registry=r)
        self._proposed = p.Counter("edgespec_drafted_tokens", "tokens the drafter proposed", m,
                                   registry=r)
        self._accepted = p.Counter("edgespec_accepted_tokens", "drafted tokens the target kept",
                                   m, registry=r)
        self._lookups = p.Counter("edgespec_prefix_cache_lookups", "prompts looked up in the "
                                  "prefix cache", registry=r)
        self._hits = p.Counter("edgespec_prefix_cache_hits", "prompts that reused a cached "
                               "prefix", registry=r)
        self._hit_tokens = p.Counter("edgespec_prefix_cache_hit_tokens", "prompt tokens whose KV "
                                     "came from the prefix cache", registry=r)
        self._looked_tokens = p.Counter("edgespec_prefix_cache_prompt_tokens", "prompt tokens "
                                        "looked up in the prefix cache", registry=r)
        self._queued = p.Gauge("edgespec_queue_waiting", "jobs waiting in the queue", registry=r)
        self._active = p.Gauge("edgespec_requests_active", "generations decoding now", registry=r)
        self._seconds = p.Histogram("edgespec_request_seconds", "a generation's prefill + decode "
                                    "seconds (not its time in the queue)", m, buckets=_BUCKETS,
                                    registry=r)
        self._ttft = p.Histogram("edgespec_prefill_seconds", "a generation's prefill seconds "
                                 "(its time to first token once out of the queue)", m,
                                 buckets=_BUCKETS, registry=r)
        self._render = lambda: p.generate_latest(r)
        self._content_type = p.exposition.CONTENT_TYPE_PLAIN_0_0_4
        self._created = time.monotonic()
        self._window: deque[tuple[float, int]] = deque()  # (monotonic time, tokens) per step
        self._lock = threading.Lock()
        self._methods: set[str] = set()

    # -- the worker's calls --------------------------------------------------------------------

    def request_started(self, method: str) -> None:
        self._methods.add(method)
        self._started.labels(method).inc()

    def step(self, method: str, tokens: int, proposed: int, accepted: int) -> None:
        self._methods.add(method)
        self._steps.labels(method).inc()
        self._generated.labels(method).inc(tokens)
        self._proposed.labels(method).inc(proposed)
        self._accepted.labels(method).inc(accepted)
        now = time.monotonic()
        with self._lock:
            self._window.append((now, tokens))
            self._forget(now)

    def request_finished(self, method: str, reason: str, stats: Stats) -> None:
        self._methods.add(method)
        self._finished.labels(method, reason).inc()
        self._prompt.labels(method).inc(stats.prompt_tokens)
        self._seconds.labels(method).observe(stats.prefill_s + stats.decode_s)
        if stats.generated_tokens:
            self._ttft.labels(method).observe(stats.prefill_s)

    def prefix(self, hit_tokens: int, prompt_tokens: int) -> None:
        self._lookups.inc()
        if hit_tokens > 0:
            self._hits.inc()
        self._hit_tokens.inc(hit_tokens)
        self._looked_tokens.inc(prompt_tokens)

    def queue(self, queued: int, active: int) -> None:
        self._queued.set(queued)
        self._active.set(active)

    # -- reading them --------------------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """The body and content type of ``/metrics``: Prometheus text format 0.0.4."""
        return self._render(), self._content_type

    def snapshot(self) -> dict:
        """What ``/health`` adds: tokens/s over the last ``WINDOW_S`` seconds (or since the
        metrics were made, if that is shorter), per method its requests, tokens and acceptance
        (accepted / drafted; None before anything was drafted), and the prefix cache's hits."""
        now = time.monotonic()
        with self._lock:
            self._forget(now)
            tokens = sum(n for _, n in self._window)
        span = min(WINDOW_S, now - self._created)
        get = self.registry.get_sample_value
        methods = {}
        for m in sorted(self._methods):
            proposed, accepted = self._count("drafted_tokens", m), self._count("accepted_tokens", m)
            methods[m] = {"requests": int(self._count("requests_started", m)),
                          "generated_tokens": int(self._count("generated_tokens", m)),
                          "drafted_tokens": int(proposed), "accepted_tokens": int(accepted),
                          "acceptance": accepted / proposed if proposed else None}
        looked = get("edgespec_prefix_cache_prompt_tokens_total") or 0.0
        hit = get("edgespec_prefix_cache_hit_tokens_total") or 0.0
        return {"tokens_per_s": tokens / span if span > 0 else 0.0, "methods": methods,
                "prefix_cache": {"lookups": int(get("edgespec_prefix_cache_lookups_total") or 0),
                                 "hits": int(get("edgespec_prefix_cache_hits_total") or 0),
                                 "hit_tokens": int(hit), "prompt_tokens": int(looked),
                                 "hit_rate": hit / looked if looked else None}}

    def _count(self, name: str, method: str) -> float:
        """The counter ``edgespec_{name}`` of ``method`` (0 before it was first counted)."""
        return self.registry.get_sample_value(f"edgespec_{name}_total", {"method": method}) or 0.0

    def _forget(self, now: float) -> None:
        """Drop the window's steps older than ``WINDOW_S`` (the lock is held)."""
        while self._window and self._window[0][0] < now - WINDOW_S:
            self._window.popleft()
