"""The native RMSNorm and q|k|v split + RoPE (kernels/rope_norm.py, native/rope_norm.cpp)
against their pure-MLX twins (mx.fast.rms_norm, mx.fast.rope): random shapes, head counts,
rotated widths (0, part of a head, all of it), both pair layouts, base or explicit frequencies
(llama3), position scale, mscale, chain offsets and per-token tree positions up to 8k.
Tolerances (stated in kernels/rope_norm.py): 1e-5 relative for the norm; for RoPE 2e-6 plus
the angle's float32 rounding, position x 1e-7, times max |x|. A row's result is bit-identical
whatever other rows come with it, and the fused block runs the native ops.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.kernels import backend, rope_norm
from edgespec.kernels.backend import KernelError  # noqa: F401  (the error type of bad shapes)

from .test_kernels import mod  # noqa: F401  (the fixture: the module, or skip / fail)


def _rope_case(rng, m, heads, kv, d, dims, traditional, explicit, scale, mscale, tree):
    y = mx.array(rng.standard_normal((1, m, (heads + 2 * kv) * d), dtype=np.float32))
    base = None if explicit else float(rng.choice([10000.0, 500000.0, 100.0]))
    freqs = mx.array(rng.uniform(1.0, 5e4, dims // 2).astype(np.float32)) if explicit else None
    if tree:
        pos = mx.array(rng.integers(0, 8192, m).astype(np.int32))
    else:
        pos = mx.array(int(rng.integers(0, 8192)), dtype=mx.int32)
    inv = rope_norm.inverse_frequencies(dims, base, freqs) if dims else mx.zeros((0,))
    args = (y, pos, inv, heads, kv, d, dims, traditional, mscale, scale, base, freqs)
    return args, int(mx.max(pos).item()) + m


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), m=st.integers(1, 20), heads=st.sampled_from([1, 3, 9]),
       ratio=st.sampled_from([1, 3]), d=st.sampled_from([8, 16, 64, 80]),
       part=st.sampled_from([0.0, 0.5, 1.0]), traditional=st.booleans(), explicit=st.booleans(),
       scale=st.sampled_from([1.0, 0.25]), mscale=st.sampled_from([1.0, 1.19]), tree=st.booleans())
def test_qkv_rope_matches_its_twin(mod, seed, m, heads, ratio, d, part, traditional, explicit,
                                   scale, mscale, tree):
    rng = np.random.default_rng(seed)
    kv = max(1, heads // ratio)
    dims = int(d * part) // 2 * 2
    if explicit and dims == 0:
        explicit = False
    args, top = _rope_case(rng, m, heads, kv, d, dims, traditional, explicit, scale, mscale, tree)
    y, pos, inv, *rest = args
    got = mod.qkv_rope(y[0], pos, inv, *rest[:7])
    want = rope_norm.qkv_rope_twin(*args)
    big = float(mx.abs(y).max().item()) * max(mscale, 1.0)
    tol = (2e-6 + top * scale * 1e-7) * big * 2
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert float(mx.abs(g - w).max().item()) <= tol


def test_qkv_rope_rows_do_not_depend_on_each_other(mod):
    rng = np.random.default_rng(3)
    args, _ = _rope_case(rng, 12, 9, 3, 64, 64, False, False, 1.0, 1.0, True)
    y, pos, inv, *rest = args
    whole = mod.qkv_rope(y[0], pos, inv, *rest[:7])
    for i in (0, 5, 11):
        alone = mod.qkv_rope(y[0, i : i + 1], pos[i : i + 1], inv, *rest[:7])
        for a, b in zip(whole, alone):
            assert mx.array_equal(a[:, :, i : i + 1], b).item()


def test_qkv_rope_chain_offset_is_positions_from_the_offset(mod):
    rng = np.random.default_rng(4)
    args, _ = _rope_case(rng, 6, 3, 1, 16, 16, True, False, 1.0, 1.0, False)
    y, pos, inv, *rest = args
    chain = mod.qkv_rope(y[0], pos, inv, *rest[:7])
    listed = mod.qkv_rope(y[0], pos + mx.arange(6, dtype=mx.int32), inv, *rest[:7])
    for a, b in zip(chain, listed):
        assert mx.array_equal(a, b).item()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), shape=st.sampled_from([(1, 1, 576), (1, 8, 576), (3, 5, 64),
                                                          (2, 7, 9, 64), (17, 1000), (1, 1)]),
       eps=st.sampled_from([1e-5, 1e-6, 0.1]))
def test_rms_norm_matches_its_twin(mod, seed, shape, eps):
    rng = np.random.default_rng(seed)
    x = mx.array((rng.standard_normal(shape) * rng.uniform(0.01, 100)).astype(np.float32))
    w = mx.array(rng.standard_normal(shape[-1]).astype(np.float32))
    got, want = mod.rms_norm(x, w, eps), rope_norm.rms_norm_twin(x, w, eps)
    assert got.shape == want.shape
    assert mx.allclose(got, want, rtol=1e-5, atol=1e-6).item()
    # one row alone gives the same bits
    x2 = x.reshape(-1, shape[-1])
    assert mx.array_equal(mod.rms_norm(x2[:1], w, eps), mod.rms_norm(x2, w, eps)[:1]).item()


def test_bad_inputs_name_what_is_allowed(mod):
    with pytest.raises(ValueError, match="rms_norm: need x \\(..., H\\) and w \\(H,\\)"):
        mod.rms_norm(mx.zeros((2, 8)), mx.zeros((7,)), 1e-5)
    with pytest.raises(ValueError, match="rms_norm: x and w must be float32"):
        mod.rms_norm(mx.zeros((2, 8), dtype=mx.float16), mx.zeros((8,)), 1e-5)
    y, pos, inv = mx.zeros((3, 5 * 8)), mx.array(0, dtype=mx.int32), mx.zeros((4,))
    with pytest.raises(ValueError, match="qkv_rope: need y \\(M, \\(heads \\+ 2 kv_heads\\)"):
        mod.qkv_rope(y, pos, inv, 4, 1, 8, 8, False, 1.0, 1.0)
    with pytest.raises(ValueError, match="even dims <= head_dim"):
        mod.qkv_rope(y, pos, inv, 3, 1, 8, 7, False, 1.0, 1.0)
    with pytest.raises(ValueError, match="scalar offset or one per row"):
        mod.qkv_rope(y, mx.zeros((2,), dtype=mx.int32), inv, 3, 1, 8, 8, False, 1.0, 1.0)
    with pytest.raises(ValueError, match="int32 positions"):
        mod.qkv_rope(y, mx.array(0.0), inv, 3, 1, 8, 8, False, 1.0, 1.0)


def test_the_fused_block_runs_the_native_ops(mod, monkeypatch, tiny_models):
    from edgespec.targets import load_target  # noqa: PLC0415

    calls = {"rms_norm": 0, "qkv_rope": 0}
    for name in calls:
        real = getattr(mod, name)

        def counted(*a, _real=real, _name=name, **kw):
            calls[_name] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(mod, name, counted)
    monkeypatch.setenv("EDGESPEC_COMPILE", "0")
    target = load_target(tiny_models.path(layers=2), dtype="float32")
    cache = target.make_cache()
    target.score(list(range(4, 44)), cache)  # 40 tokens: above the native block's 32
    assert backend.use_native_block_ops()
    assert calls["qkv_rope"] == target.num_layers and calls["rms_norm"] >= 2 * target.num_layers
