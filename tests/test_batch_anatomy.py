"""``scripts/batch_anatomy.py``'s timers: they count only the rounds in which every client's
decoding ran throughout, time the shared forwards and the ones run alone inside them, and put
``Batch`` back."""

from __future__ import annotations

from edgespec import batch as batch_module

from .script_module import load_script
from .test_lossless import MODEL, prompt_ids


def test_the_timers_count_the_steady_rounds_and_restore_the_batch(tiny_models):
    anatomy = load_script("batch_anatomy")
    target = tiny_models.load(**MODEL)
    base = prompt_ids(target)
    prompts = [base, base[:-3] + [7, 8, 9], base[:-5] + [11, 12]]
    B = batch_module.Batch
    real = B.round, B._score, B._answer
    with anatomy.Timed(3) as timed:
        out = anatomy.run(target, "none", "shared", 3, prompts, 12)
    assert (B.round, B._score, B._answer) == real
    c = timed.counts
    assert c["rounds"] > 0 and 0 < c["forward_s"] + c["alone_s"] <= c["round_s"]
    assert c["alone_s"] > 0  # the prompts' prefill chunks, run alone
    # the round in which the decodings finish is not counted: its tokens are missing
    assert 0 < c["tokens"] < out["tokens"] == 3 * 12
