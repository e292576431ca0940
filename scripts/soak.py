"""A soak of ``edgespec serve``: many clients for many minutes, with disconnects and cancels.

The server runs in this process (the real app on a uvicorn thread, as ``edgespec serve`` runs
it) and ``--clients`` threads (``soak_client.py``, beside this file) load it over HTTP for
``--minutes``. Each request picks at random a prompt from a pool, a method, a ``max_tokens``
from a ladder and a mode (streamed, whole, disconnected mid-stream, cancelled by a client
timeout); every request is greedy (temperature 0). Prompts and ``max_tokens`` repeat so that
each distinct completed (prompt, method, max_tokens) can then be replayed alone, one at a time,
on the same server: every completed output must equal its solo replay. The server's resident
memory is sampled every ``--rss-every`` seconds (it runs in this process); the prefix cache
fills during the warm-up (the pool bounds what it can hold), after which RSS must stay flat.

Requirements (issue 35; a miss is listed in ``failures`` and exits non-zero): no 5xx (seen by a
client, sent to a client that had gone, or as a stream's error event), no transport error, the
server drained when the clients stop, resident memory growth after warm-up (the first
``--warmup`` of the run) at most 5%, no output that differs from solo.

    .venv/bin/python scripts/soak.py --minutes 20 --json soak.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from tqdm import tqdm

from edgespec.server import ServerSettings, ServerState, create_app

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its clients, beside it
from soak_client import body, build_prompts, client  # noqa: E402

MAX_GROWTH_PCT = 5.0  # issue 35: resident memory growth after warm-up


# -- the server, in this process -----------------------------------------------------------------

class StatusCount:
    """ASGI wrapper counting every status the server sends, also to clients that have gone."""

    def __init__(self, app):
        self.app, self.counts = app, Counter()

    async def __call__(self, scope, receive, send):
        async def record(message):
            if message["type"] == "http.response.start":
                self.counts[message["status"]] += 1
            await send(message)
        try:
            await self.app(scope, receive, record if scope["type"] == "http" else send)
        except BaseException:
            self.counts["exception"] += 1
            raise


class Server:
    """The real app on a uvicorn thread, bound to a free loopback port."""

    def __init__(self, settings: ServerSettings):
        self.state = ServerState.start(settings, progress=False)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.app = StatusCount(create_app(self.state))
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.state.stop()


def rss_mb() -> float:
    """This process's resident memory (the server's: it runs here), from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def sample_rss(stop: threading.Event, every: float, out: list) -> None:
    t0 = time.monotonic()
    while True:
        out.append((time.monotonic() - t0, rss_mb()))
        if stop.wait(every):
            return


# -- phases --------------------------------------------------------------------------------------

def load_phase(opts, prompts: list[str], progress: bool) -> tuple[list[dict], list, float]:
    """Run the clients for ``opts.minutes``; the records, the RSS samples and the wall time."""
    seconds = opts.minutes * 60
    rss: list = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_rss, args=(stop, opts.rss_every, rss), daemon=True)
    sampler.start()
    per_client: list[list] = [[] for _ in range(opts.clients)]
    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(k, opts, prompts, t0 + seconds, per_client[k]))
               for k in range(opts.clients)]
    for t in threads:
        t.start()
    with tqdm(total=round(seconds), unit="s", disable=not progress, desc="soak") as bar:
        while any(t.is_alive() for t in threads):
            time.sleep(0.5)
            bar.n = min(round(time.monotonic() - t0), bar.total)
            bar.set_postfix(requests=sum(map(len, per_client)),
                            rss_mb=round(rss[-1][1]) if rss else None, refresh=False)
            bar.refresh()
    wall = time.monotonic() - t0
    rss.append((wall, rss_mb()))
    stop.set()
    sampler.join()
    return [r for c in per_client for r in c], rss, wall


def drain(url: str, limit_s: float = 120.0) -> tuple[bool, float, dict]:
    """Wait until the server has no job queued or decoding (cancelled jobs must not linger)."""
    t0 = time.monotonic()
    while True:
        h = httpx.get(url + "/health", timeout=30).json()
        if h["active"] == 0 and h["queued"] == 0:
            return True, time.monotonic() - t0, h
        if time.monotonic() - t0 > limit_s:
            return False, time.monotonic() - t0, h
        time.sleep(0.2)


def replay(opts, prompts: list[str], records: list[dict], progress: bool) -> dict:
    """Each distinct completed request again, alone; every completed output must match it."""
    keys = sorted({tuple(r["key"]) for r in records if r["outcome"] == "completed"})
    if opts.replay_limit and len(keys) > opts.replay_limit:
        keys = sorted(random.Random(opts.seed).sample(keys, opts.replay_limit))
    solo = {}
    with httpx.Client(timeout=600) as http:
        for pid, method, max_tokens in tqdm(keys, desc="solo replay", disable=not progress):
            r = http.post(opts.url + "/v1/chat/completions",
                          json=body(opts.model_name, prompts[pid], method, max_tokens, False))
            r.raise_for_status()
            solo[pid, method, max_tokens] = r.json()["choices"][0]["message"]["content"]
    checked = [r for r in records if r["outcome"] == "completed" and tuple(r["key"]) in solo]
    bad = [r for r in checked if r["text"] != solo[tuple(r["key"])]]
    return {"distinct": len({tuple(r["key"]) for r in records if r["outcome"] == "completed"}),
            "replayed": len(keys), "checked": len(checked), "mismatches": len(bad),
            "examples": [{"key": r["key"], "mode": r["mode"], "batched": r["text"][:200],
                          "solo": solo[tuple(r["key"])][:200]} for r in bad[:5]]}


# -- the summary ---------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (None for no values)."""
    v = sorted(values)
    return round(v[max(0, math.ceil(q * len(v)) - 1)], 4) if v else None


def scrape(url: str) -> dict:
    """A few of /metrics' counters, summed over their labels."""
    text = httpx.get(url + "/metrics", timeout=30).text
    want = {"edgespec_requests_started_total", "edgespec_generated_tokens_total",
            "edgespec_prefix_cache_lookups_total", "edgespec_prefix_cache_hits_total",
            "edgespec_prefix_cache_hit_tokens_total", "edgespec_steps_total"}
    out: dict = {"finished_by_reason": {}}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in want:
                out[s.name] = out.get(s.name, 0) + s.value
            elif s.name == "edgespec_requests_finished_total":
                reason = s.labels.get("reason", "?")
                out["finished_by_reason"][reason] = out["finished_by_reason"].get(reason, 0) + s.value
    return out


def rss_summary(rss: list, wall: float, warmup: float, window: float = 0.1) -> dict:
    """Growth from the median RSS just after warm-up (a ``window`` of the run) to the median of
    the run's last ``window``: medians, since RSS swings by a few % as batches come and go."""
    def median_in(lo: float, hi: float) -> float:
        inside = [mb for t, mb in rss if lo * wall <= t <= hi * wall]
        return statistics.median(inside or [min(rss, key=lambda x: abs(x[0] - lo * wall))[1]])
    warm, end = median_in(warmup, warmup + window), median_in(1 - window, 1)
    return {"warmup_end_mb": round(warm, 1), "end_mb": round(end, 1),
            "peak_mb": round(max(mb for _, mb in rss), 1),
            "growth_pct": round(100 * (end - warm) / warm, 2), "samples": len(rss),
            "series": [(round(t, 1), round(mb, 1)) for t, mb in rss]}


def summarize(records: list[dict], wall: float, rss: dict, ident: dict, server: dict,
              metrics: dict) -> dict:
    outcomes = Counter(r["outcome"] for r in records)
    status = Counter(r["status"] for r in records if "status" in r)
    done = [r for r in records if r["outcome"] == "completed"]
    server_5xx = sum(n for s, n in server["statuses"].items() if isinstance(s, int) and s >= 500)
    stream_5xx = sum(1 for r in records if r["outcome"] == "stream_error"
                     and r["error"].get("type") == "server_error")
    s = {"wall_s": round(wall, 1), "requests": len(records),
         "by_mode": dict(Counter(r["mode"] for r in records)), "outcomes": dict(outcomes),
         "completed": outcomes["completed"],
         "completed_by_mode": dict(Counter(r["mode"] for r in done)),
         "disconnected": outcomes["disconnected"],
         "cancelled": outcomes["cancelled"],
         # jobs the server stopped early; a client that went away after its job ended is not one
         "server_cancelled": metrics.get("finished_by_reason", {}).get("cancelled", 0),
         "status": {str(k): v for k, v in status.items()},
         "5xx": sum(n for k, n in status.items() if k >= 500) + stream_5xx,
         "server_5xx": server_5xx, "429": sum(r["429"] for r in records),
         "latency_s": {"p50": pct([r["latency"] for r in done], .5),
                       "p99": pct([r["latency"] for r in done], .99), "n": len(done)},
         "ttft_s": {"p50": pct([r["ttft"] for r in done if "ttft" in r], .5),
                    "p99": pct([r["ttft"] for r in done if "ttft" in r], .99)},
         "completed_tokens_per_s": sum(r.get("tokens", 0) for r in done) / wall,
         "generated_tokens_per_s": metrics.get("edgespec_generated_tokens_total", 0) / wall,
         "rss": rss, "identity": ident, "server": server, "metrics": metrics}
    s["failures"] = failures(s)
    return s


def failures(s: dict, check_memory: bool = True) -> list[str]:
    """The requirements the run missed (empty: passed)."""
    out = []
    errors = sum(n for k, n in s["outcomes"].items()
                 if k not in ("completed", "disconnected", "cancelled"))
    checks = [(s["5xx"] == 0, f"{s['5xx']} 5xx answers"),
              (s["server_5xx"] == 0, f"the server sent {s['server_5xx']} 5xx"),
              (s["server"]["statuses"].get("exception", 0) == 0, "the app raised"),
              (errors == 0, f"{errors} requests neither completed nor went away on purpose"),
              (s["server"]["drained"], "jobs still running after the clients stopped"),
              (s["server"]["health"]["status"] == "ok", "the server is not healthy at the end"),
              (s["identity"]["mismatches"] == 0,
               f"{s['identity']['mismatches']} outputs differ from solo")]
    if check_memory:
        checks.append((s["rss"]["growth_pct"] <= MAX_GROWTH_PCT,
                       f"RSS grew {s['rss']['growth_pct']}% after warm-up (limit {MAX_GROWTH_PCT}%)"))
    return [msg for ok, msg in checks if not ok]


def soak(opts, progress: bool = True) -> dict:
    """Start the server, load it, drain it, replay solo, stop it; the summary."""
    settings = ServerSettings(model=opts.model, dtype=opts.dtype, draft=opts.draft,
                              max_concurrency=opts.max_concurrency, max_queue=opts.max_queue,
                              reuse_prefix=not opts.no_prefix_reuse,
                              **({"kv_budget_mb": opts.kv_budget_mb} if opts.kv_budget_mb else {}))
    srv = Server(settings)
    try:
        opts.url, opts.model_name = srv.url, srv.state.model_name
        served = set(srv.state.methods) | {"default"}
        if set(opts.methods) - served:
            raise SystemExit(f"--methods {sorted(set(opts.methods) - served)} not served here; "
                             f"this server serves {sorted(served)}")
        prompts = build_prompts(random.Random(opts.seed), opts.prompts, opts.prefix_words)
        records, rss, wall = load_phase(opts, prompts, progress)
        drained, drain_s, _ = drain(srv.url)
        metrics = scrape(srv.url)
        ident = replay(opts, prompts, records, progress)
        health = httpx.get(srv.url + "/health", timeout=30).json()
        server = {"drained": drained, "drain_s": round(drain_s, 2), "health": health,
                  "statuses": dict(srv.app.counts)}
        return summarize(records, wall, rss_summary(rss, wall, opts.warmup), ident, server,
                         metrics)
    finally:
        srv.stop()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default, what in (
            ("--model", "demo", None), ("--dtype", "float32", None), ("--draft", None, None),
            ("--max-concurrency", 8, None), ("--max-queue", 64, None), ("--minutes", 20.0, None),
            ("--clients", 8, None), ("--seed", 0, None),
            ("--methods", "default,lookup,none", "comma-separated; 'default' sends no method"),
            ("--max-tokens", "8,16,32,64,128", "the ladder each request's max_tokens is drawn from"),
            ("--prompts", 32, "size of the prompt pool"),
            ("--prefix-words", 530, "words of each long file (~600 demo tokens)"),
            ("--cancel-after", "0.05,3", "seconds: the range of a cancel's client timeout"),
            ("--disconnect-chunks", 8, "a disconnect closes after 1..this many content chunks"),
            ("--warmup", 0.2, "fraction of the run before the RSS baseline"),
            ("--rss-every", 5.0, "seconds between RSS samples"),
            ("--replay-limit", 0, "replay at most this many distinct requests (0: all)"),
            ("--kv-budget-mb", 0, "the server's KV budget, prefix cache included (0: its default)")):
        ap.add_argument(flag, default=default, help=what,
                        type=type(default) if default is not None else None)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--no-prefix-reuse", action="store_true",
                    help="serve without the prefix cache (tells its growth from a leak)")
    a = ap.parse_args(argv)
    a.methods = a.methods.split(",")
    a.max_tokens = [int(x) for x in a.max_tokens.split(",")]
    a.cancel_after = tuple(float(x) for x in a.cancel_after.split(","))
    return a


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    s = soak(opts, progress=not opts.no_progress)
    lat, ttft, rss = s["latency_s"], s["ttft_s"], s["rss"]
    print(f"{s['requests']} requests in {s['wall_s']} s {s['by_mode']}: {s['outcomes']}; "
          f"5xx {s['5xx']} (server-side {s['server_5xx']}), 429 {s['429']}; the server "
          f"cancelled {s['server_cancelled']:.0f} of the {s['disconnected'] + s['cancelled']} "
          "requests whose clients went away")
    print(f"latency p50 {lat['p50']} s p99 {lat['p99']} s (completed, n={lat['n']}); "
          f"time to first token p50 {ttft['p50']} s p99 {ttft['p99']} s (streamed)")
    print(f"tokens/s: completed {s['completed_tokens_per_s']:.1f}, generated "
          f"{s['generated_tokens_per_s']:.1f}; RSS {rss['warmup_end_mb']} -> {rss['end_mb']} MiB "
          f"({rss['growth_pct']:+}%), peak {rss['peak_mb']}")
    print(f"identity: {s['identity']['checked']} outputs over {s['identity']['replayed']} "
          f"replays, {s['identity']['mismatches']} mismatches; server {s['server']['statuses']}, "
          f"drained in {s['server']['drain_s']} s; metrics {s['metrics']}")
    print("PASS" if not s["failures"] else "FAIL: " + "; ".join(s["failures"]))
    if opts.json:
        opts.json.write_text(json.dumps(s, indent=1, default=str))
    return 1 if s["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
