"""Measuring scripts whose parts can break silently as the code changes:
``scripts/block_phases.py``'s marks must still find their places in ``block.cpp``,
``scripts/auto_arms_ab.py``'s ``auto+eagle3`` must build auto as on a flat curve and put the
steep-curve threshold back, ``scripts/corpus_questions.py`` must leave the held-out questions
out, and the in-process A/B scripts (``cache_in_place_ab.py``, ``batch_stack_ab.py``) must switch
to their other variant and put the code back."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from edgespec.drafters import registry

from .script_module import SCRIPTS, load_script

BLOCK_CPP = SCRIPTS.parent / "edgespec" / "kernels" / "native" / "block.cpp"


def test_block_phases_marks_every_phase_of_the_current_block():
    phases = load_script("block_phases")
    src = BLOCK_CPP.read_text()
    out = phases.instrumented(src)  # exits naming the anchor when one is gone or doubled
    assert all(out.count(f"MARK({i})") == 1 for i in range(12))
    assert out.count("prof::last_end = t0;") == 1
    assert out.count("job.handed = prof::now_us();") == 1
    assert out.count("double handed = 0;") == 1


def test_auto_plus_eagle3_builds_auto_on_a_flat_curve_and_restores_the_threshold(monkeypatch):
    ab = load_script("auto_arms_ab")
    seen = []

    class Built:
        arms = {"corpus": object()}

    def fake_make(spec, target, sampling):
        seen.append((spec.method, registry.STEEP_RATIO))
        if target == "fails":
            raise RuntimeError("no head")
        return Built()

    monkeypatch.setattr(ab, "make_drafter", fake_make)
    before = registry.STEEP_RATIO
    ab.drafter_for("auto+eagle3", "target")
    ab.drafter_for("auto", "target")
    with pytest.raises(RuntimeError):
        ab.drafter_for("auto+eagle3", "fails")
    assert seen == [("auto", math.inf), ("auto", before), ("auto", math.inf)]
    assert registry.STEEP_RATIO == before


def test_corpus_questions_are_the_runs_first_questions_outside_the_held_out_set():
    script = load_script("corpus_questions")
    held = script.held_out()
    assert len(held) == 64
    data = script.questions_file(1, 40)
    assert data == script.questions_file(1, 40)  # the bytes depend on the run and count alone
    prompts = [json.loads(line)["prompt"] for line in data.decode().splitlines()]
    assert len(prompts) == 40 and not held & {p.strip() for p in prompts}
    assert script.questions_file(1, 41).startswith(data)
    # past the run's first held-out question: it is skipped and the next one taken
    with gzip.open(script.DATA / "eagle3-questions-run1.jsonl.gz", "rt") as f:
        run = [json.loads(line)["prompt"] for line in f]
    first = next(i for i, q in enumerate(run) if q.strip() in held)
    after = [json.loads(line)["prompt"]
             for line in script.questions_file(1, first + 1).decode().splitlines()]
    assert after == run[:first] + [run[first + 1]] and run[first + 1].strip() not in held
    with pytest.raises(ValueError, match="fewer than"):
        script.questions_file(1, 10**6)


def test_cache_in_place_ab_switches_the_writes_and_puts_them_back(monkeypatch):
    """``slice updates`` makes ``KVCache.in_place_buffers`` answer no (keeping the writer to wait
    for), and ``decode`` puts the method back however it ends."""
    import mlx.core as mx

    from edgespec.cache import KVCache

    ab = load_script("cache_in_place_ab")
    cache = KVCache(2)
    assert ab.slice_updates(cache) == (False, [])
    writer = mx.array([1.0])
    cache.wrote(writer)
    ok, after = ab.slice_updates(cache)
    assert not ok and len(after) == 1 and after[0] is writer

    def fails(*a, **kw):
        assert KVCache.in_place_buffers is ab.slice_updates
        raise RuntimeError("stop")

    monkeypatch.setattr(ab, "Engine", fails)
    with pytest.raises(RuntimeError):
        ab.decode(None, "none", "hi", "slice updates")
    assert KVCache.in_place_buffers is ab.IN_PLACE


def test_batch_stack_ab_switches_the_shared_forward_and_puts_it_back(monkeypatch):
    """``a layer each`` makes ``Decoder._run_many_stack`` answer None (one block operation a
    layer), ``one operation`` keeps it as built, and ``together`` puts it back however it
    ends."""
    from edgespec.targets.decoder import Decoder

    ab = load_script("batch_stack_ab")
    assert ab.VARIANTS["one operation"] is ab.AS_BUILT is Decoder._run_many_stack
    assert ab.VARIANTS["a layer each"](object(), "x", "masks", "caches", ()) is None
    seen = []

    def fails(*a, **kw):
        seen.append(Decoder._run_many_stack)
        raise RuntimeError("stop")

    monkeypatch.setattr(ab, "Engine", fails)
    for variant in ab.VARIANTS:
        with pytest.raises(RuntimeError):
            ab.together(None, "none", ["hi"], variant)
        assert Decoder._run_many_stack is ab.AS_BUILT
    assert seen == [ab.VARIANTS["one operation"], ab.VARIANTS["a layer each"]]
