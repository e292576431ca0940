"""The clairvoyant lookup bound of scripts/lookup_sim.py counts what could be copied, no more."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "lookup_sim.py"


def _sim():
    spec = importlib.util.spec_from_file_location("lookup_sim", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bound_is_plain_decoding_when_nothing_repeats():
    rows = _sim().clairvoyant([{"category": "c", "prompt": [1, 2, 3], "output": [4, 5, 6, 7, 8]}])
    assert rows["overall"]["tau"] == 1.0
    assert rows["overall"]["est_speedup"] == 1.0


def test_bound_copies_a_span_of_the_prompt_in_one_step():
    sim = _sim()
    span = list(range(10, 20))
    rows = sim.clairvoyant([{"category": "c", "prompt": [1, *span, 2, 10], "output": span[1:] + [3]}])
    # the answer continues "10" exactly as the prompt did: 9 tokens, then one that was never seen;
    # one step drafts the copy (the last token of the output is always the target's own)
    assert rows["overall"]["tau"] == 10.0
    assert rows["overall"]["est_speedup"] == 10 * sim.cost(1) / sim.cost(10)
