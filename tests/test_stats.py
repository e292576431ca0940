"""The one formatter of ``Stats``: the human line, the machine dict, table values."""

from __future__ import annotations

from edgespec.server.responses import usage
from edgespec.stats import Stats, format_metric, phrase

DRAFT = Stats(method="draft", prompt_tokens=20, cached_tokens=8, generated_tokens=30,
              target_forwards=12, proposed=40, accepted=18, decode_s=1.5)


def test_summary_line():
    assert DRAFT.summary() == "[draft] 30 tokens, 20.0 tok/s, τ 2.50, accepted 45%, 8 cached"
    assert DRAFT.summary(1.234, "stopped").endswith("8 cached, 1.23× vs plain, stopped")
    plain = Stats(generated_tokens=4, target_forwards=4, decode_s=2.0)
    assert plain.summary() == "[none] 4 tokens, 2.0 tok/s"  # τ is 1 by definition: not shown


def test_as_dict_carries_every_field_and_ratio():
    d = DRAFT.as_dict()
    assert d["tau"] == 2.5 and d["acceptance_rate"] == 0.45 and d["tokens_per_s"] == 20.0
    assert d["cached_tokens"] == 8 and d["method"] == "draft"
    spec = usage(DRAFT)["speculative"]
    assert spec == {k: d[k] for k in spec} and spec["tau"] == 2.5


def test_table_values_and_phrases():
    assert format_metric("tau", 1.0) == "1.00" and format_metric("speedup", 1.184) == "1.18×"
    assert format_metric("acceptance_rate", None) == "—"
    assert phrase("tokens_per_s", 12.34) == "12.3 tok/s"
