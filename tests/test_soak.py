"""The soak (``scripts/soak.py``) in a shortened form: 20 s of six clients on a tiny random model.

It checks what the long soak requires except the memory bound (too short a run to mean anything;
it must be reported): no 5xx seen by a client or sent by the server, every kind of request
exercised (streamed and whole answers completed, disconnects and cancels), jobs cancelled on the
server when their clients went away, the server drained and healthy after, and every completed
output identical to the same request decoded alone.
"""

from __future__ import annotations

import pytest

from .script_module import load_script

ARGS = ["--minutes", "0.33", "--clients", "6", "--max-concurrency", "4", "--prompts", "8",
        "--prefix-words", "40", "--max-tokens", "16,128", "--cancel-after", "0.001,0.05",
        "--disconnect-chunks", "2", "--rss-every", "0.5"]


@pytest.fixture(scope="module")
def summary(tiny_models):
    soak = load_script("soak")
    model = tiny_models.path(context=2048, tie=False)
    s = soak.soak(soak.parse(["--model", str(model), *ARGS]), progress=False)
    return soak, s


def test_no_5xx_and_no_error(summary):
    soak, s = summary
    assert soak.failures(s, check_memory=False) == [], s["failures"]
    assert s["5xx"] == 0 and s["server_5xx"] == 0
    assert set(s["outcomes"]) <= {"completed", "disconnected", "cancelled"}, s["outcomes"]


def test_every_kind_exercised(summary):
    _, s = summary
    assert set(s["by_mode"]) == {"stream", "full", "disconnect", "cancel"}
    assert {"stream", "full"} <= set(s["completed_by_mode"]), s["completed_by_mode"]
    assert s["disconnected"] >= 1 and s["cancelled"] >= 1, s["outcomes"]
    assert s["metrics"]["edgespec_prefix_cache_hits_total"] >= 1  # the resent files


def test_server_cancels_and_drains(summary):
    _, s = summary
    assert s["metrics"]["finished_by_reason"].get("cancelled", 0) >= 1
    assert s["server"]["health"]["cancelled"] >= 1
    assert s["server"]["drained"] and s["server"]["health"]["status"] == "ok"
    assert s["server"]["health"]["active"] == 0 and s["server"]["health"]["queued"] == 0


def test_identical_to_solo(summary):
    _, s = summary
    ident = s["identity"]
    assert ident["mismatches"] == 0, ident["examples"]
    assert ident["replayed"] == ident["distinct"] >= 1
    assert ident["checked"] == s["completed"]


def test_latency_and_memory_reported(summary):
    _, s = summary
    assert 0 < s["latency_s"]["p50"] <= s["latency_s"]["p99"]
    assert 0 < s["ttft_s"]["p50"] <= s["ttft_s"]["p99"]
    assert s["completed_tokens_per_s"] > 0
    rss = s["rss"]
    assert rss["samples"] >= 2 and rss["warmup_end_mb"] > 0 and rss["end_mb"] > 0
    assert isinstance(rss["growth_pct"], float)
