"""The worker's counters (``edgespec/metrics.py``) and a sequence's KV bytes (``kv_budget.py``).

Metrics are fed by hand here, as the worker feeds them; the server's ``/metrics`` and
``/health`` over a live worker are tested in ``test_server_admission.py``.
"""

from __future__ import annotations

import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgespec.extras import MissingExtraError
from edgespec.kv_budget import kv_bytes, kv_bytes_per_token
from edgespec.metrics import Metrics
from edgespec.stats import Stats

TARGET_KINDS = ("llama", "window", "bias")


def _samples(body: bytes) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value, read back with Prometheus' own parser."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples}


def _feed(m: Metrics) -> None:
    m.request_started("draft")
    m.prefix(0, 10)
    m.step("draft", tokens=4, proposed=5, accepted=3)
    m.step("draft", tokens=2, proposed=4, accepted=1)
    m.request_finished("draft", "length", Stats(method="draft", prompt_tokens=10,
                                                 generated_tokens=6, prefill_s=0.2, decode_s=0.5))
    m.request_started("none")
    m.prefix(8, 10)
    m.step("none", tokens=1, proposed=0, accepted=0)
    m.request_finished("none", "cancelled", Stats(method="none", prompt_tokens=10,
                                                   generated_tokens=1))
    m.queue(queued=3, active=2)


def test_render_is_prometheus_text_with_every_count():
    m = Metrics()
    _feed(m)
    body, content_type = m.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    s = _samples(body)
    assert s[("edgespec_requests_started_total", (("method", "draft"),))] == 1
    assert s[("edgespec_requests_finished_total", (("method", "draft"), ("reason", "length")))] == 1
    cancelled = (("method", "none"), ("reason", "cancelled"))
    assert s[("edgespec_requests_finished_total", cancelled)] == 1
    assert s[("edgespec_generated_tokens_total", (("method", "draft"),))] == 6
    assert s[("edgespec_drafted_tokens_total", (("method", "draft"),))] == 9
    assert s[("edgespec_accepted_tokens_total", (("method", "draft"),))] == 4
    assert s[("edgespec_prompt_tokens_total", (("method", "draft"),))] == 10
    assert s[("edgespec_prefix_cache_lookups_total", ())] == 2
    assert s[("edgespec_prefix_cache_hits_total", ())] == 1
    assert s[("edgespec_prefix_cache_hit_tokens_total", ())] == 8
    assert s[("edgespec_queue_waiting", ())] == 3 and s[("edgespec_requests_active", ())] == 2
    assert s[("edgespec_request_seconds_count", (("method", "draft"),))] == 1
    assert s[("edgespec_request_seconds_sum", (("method", "draft"),))] == pytest.approx(0.7)
    # a cancelled request that generated a token still has a prefill time; none without tokens
    assert s[("edgespec_prefill_seconds_count", (("method", "none"),))] == 1


def test_snapshot_acceptance_per_method_prefix_hits_and_tokens_per_s():
    m = Metrics()
    assert m.snapshot() == {"tokens_per_s": 0.0, "methods": {}, "prefix_cache": {
        "lookups": 0, "hits": 0, "hit_tokens": 0, "prompt_tokens": 0, "hit_rate": None}}
    _feed(m)
    snap = m.snapshot()
    assert snap["methods"]["draft"] == {"requests": 1, "generated_tokens": 6, "drafted_tokens": 9,
                                        "accepted_tokens": 4, "acceptance": 4 / 9}
    assert snap["methods"]["none"]["acceptance"] is None  # plain decoding drafts nothing
    assert snap["prefix_cache"] == {"lookups": 2, "hits": 1, "hit_tokens": 8,
                                    "prompt_tokens": 20, "hit_rate": 0.4}
    assert snap["tokens_per_s"] > 0  # 7 tokens within the window


def test_each_metrics_has_its_own_registry():
    a, b = Metrics(), Metrics()
    a.step("draft", 3, 3, 3)
    assert b.snapshot()["methods"] == {}
    assert _samples(b.render()[0]).get(("edgespec_generated_tokens_total",
                                        (("method", "draft"),))) is None


def test_without_prometheus_client_metrics_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(MissingExtraError, match=r"edgespec\[serve\]"):
        Metrics()


def test_kv_bytes_per_token_is_what_the_cache_holds(target):
    """The count from the model's shapes equals the bytes per slot of a real cache after a
    forward (each owning layer's keys + values, in the activations' dtype)."""
    cache = target.make_cache()
    target.score(list(range(1, 6)), cache)
    per_slot = sum((k.shape[1] * k.shape[3] + v.shape[1] * v.shape[3]) * k.dtype.size
                   for k, v in ((cache.keys[i], cache.values[i]) for i in cache.owners))
    assert kv_bytes_per_token(target) == per_slot > 0
    assert kv_bytes(target, None, 10) == 10 * per_slot
    assert kv_bytes(target, target, 10) == 20 * per_slot  # a draft model holds the same tokens


@pytest.mark.parametrize("family", ["gemma4_text", "lfm2", "qwen3_next"])
def test_kv_bytes_per_token_of_shared_and_recurrent_layers(family, tmp_path):
    """Gemma 4 (KV-shared layers, two head sizes) and hybrids (recurrent layers keep a state,
    not keys/values): the count still equals what the cache holds per slot."""
    pytest.importorskip("mlx_lm")
    from edgespec.targets import load_target

    from .oracle import CONFIGS, make_oracle_model

    target = load_target(make_oracle_model(tmp_path / family, CONFIGS[family]), dtype="float32")
    cache = target.make_cache()
    target.score(list(range(1, 6)), cache)
    kv = [(cache.keys[i], cache.values[i]) for i in cache.owners if cache.keys[i] is not None]
    per_slot = sum((k.shape[1] * k.shape[3] + v.shape[1] * v.shape[3]) * k.dtype.size
                   for k, v in kv)
    assert kv_bytes_per_token(target) == per_slot > 0
