"""The kernels' helper threads poll for the next job a while, then sleep: how long changes when
the work runs, never what it computes.

``set_pool_spin_us`` (for A/B timings, ``scripts/pool_spin_ab.py``) takes 0 .. 100,000 us and
refuses anything else by value; products and a whole decode give the same bits whether the
helpers sleep after every job (0), poll as by default, or poll long.
"""

from __future__ import annotations

from contextlib import contextmanager

import mlx.core as mx
import numpy as np
import pytest

from edgespec import Engine

from .test_kernels import mod  # noqa: F401  (the fixture: the module, or skip / fail)


@contextmanager
def _polling(m, us: int):
    before = m.pool_spin_us()
    m.set_pool_spin_us(us)
    try:
        yield
    finally:
        m.set_pool_spin_us(before)


def test_the_default_and_bad_values(mod):  # noqa: F811
    assert mod.pool_spin_us() == 40
    for bad in (-1, 100_001):
        with pytest.raises(ValueError, match=f"{bad} us; allowed: 0 .. 100000"):
            mod.set_pool_spin_us(bad)
    assert mod.pool_spin_us() == 40


def test_polling_changes_no_result(mod, target):  # noqa: F811
    rng = np.random.default_rng(5)
    x = mx.array(rng.standard_normal((3, 576), dtype=np.float32))
    w = mx.array(rng.standard_normal((3072, 576), dtype=np.float32))
    outs, texts = [], []
    for us in (0, mod.pool_spin_us(), 5000):
        with _polling(mod, us):
            outs.append(np.array(mod.small_matmul(x, w)))
            texts.append(Engine(target).generate("the cat sat on the mat", max_tokens=12).token_ids)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    assert texts[0] == texts[1] == texts[2]
