"""Two measuring scripts whose parts can break silently as the code changes:
``scripts/block_phases.py``'s marks must still find their places in ``block.cpp``, and
``scripts/auto_arms_ab.py``'s ``auto+eagle3`` must build auto as on a flat curve and put the
steep-curve threshold back."""

from __future__ import annotations

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
