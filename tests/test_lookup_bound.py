"""The clairvoyant lookup bound of scripts/lookup_sim.py counts what could be copied, no more."""

from __future__ import annotations

from .script_module import load_script


def _sim():
    return load_script("lookup_sim")


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
