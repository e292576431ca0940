"""The quantized kernel's int8-activation forms (kernels/qmatmul.py; AVX-512 VNNI and AVX2).

What is checked, for 4 and 8 bits and groups of 32, 64 and 128, on every ISA the CPU has an
int8 form for: a product of M rows (every M from 1 to 32) gives each row the bits it gets
alone; the AVX-512 and AVX2 forms give the same bits; the result is within 1e-5 · Σ|x̂ w| of
the pure-MLX twin (x̂ = x rounded to int8 per 32 values); a non-finite value spoils only its
own row; int8 activations are the default and ``EDGESPEC_Q8_ACTIVATIONS=0`` turns them off.
Skips like tests/test_kernels.py where the extension cannot be built.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec.kernels import backend
from edgespec.kernels.qmatmul import (quantized_small_matmul, quantized_small_matmul_native,
                                      quantized_small_matmul_q8_mlx, round_x8, symmetric_biases)

from .test_kernels import mod  # noqa: F401  (the fixture: the module, or skip / fail)

RTOL_ABS_SUM = 1e-5


def _int8_isas(mod):
    """The ISAs whose int8 form can run here (set_isa to each: has_q8_activations)."""
    before, found = mod.isa(), []
    try:
        for isa in ("avx512", "avx2"):
            if isa in mod.supported_isas().split(",") and mod.set_isa(isa) and mod.has_q8_activations():
                found.append(isa)
    finally:
        mod.set_isa(before)
    if not found:
        pytest.skip("no int8 form for this CPU")
    return found


def _quantized(rng, n, k, group_size, bits):
    return mx.quantize(mx.array(rng.standard_normal((n, k), dtype=np.float32)),
                       group_size=group_size, bits=bits)


def _within_twin(y, x, q, group_size, bits):
    w = np.array(mx.dequantize(*q, group_size=group_size, bits=bits), dtype=np.float64)
    xh = np.array(round_x8(x), dtype=np.float64).reshape(-1, w.shape[1])
    bound = RTOL_ABS_SUM * (np.abs(xh) @ np.abs(w).T) + 1e-30
    got = np.array(y).reshape(xh.shape[0], -1)
    twin = np.array(quantized_small_matmul_q8_mlx(x, *q, group_size, bits)).reshape(got.shape)
    assert (np.abs(got - twin) <= bound).all(), np.abs(got - twin).max()
    assert (np.abs(got - xh @ w.T) <= bound).all()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_every_row_count_gives_each_row_its_bits_alone(mod, bits, group_size):  # noqa: F811
    """K ends inside a 128-value step and N inside a 4-column block; rows 1..32 in one product
    against each row alone, on each ISA, and the ISAs against each other."""
    rng = np.random.default_rng(bits * 1000 + group_size)
    k = {32: 160, 64: 192, 128: 384}[group_size]
    q = _quantized(rng, 37, k, group_size, bits)
    x = mx.array(rng.standard_normal((32, k), dtype=np.float32) * rng.uniform(0.1, 5, (32, 1)))
    before, per_isa = mod.isa(), []
    try:
        for isa in _int8_isas(mod):
            mod.set_isa(isa)
            alone = mx.concatenate([quantized_small_matmul_native(x[r:r + 1], *q, group_size, bits,
                                                                  q8=True) for r in range(32)])
            for m in range(1, 33):
                y = quantized_small_matmul_native(x[:m], *q, group_size, bits, q8=True)
                assert mx.array_equal(y, alone[:m]).item(), (isa, m)
            _within_twin(alone, x, q, group_size, bits)
            per_isa.append(alone)
    finally:
        mod.set_isa(before)
    assert all(mx.array_equal(per_isa[0], other).item() for other in per_isa[1:])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k", [96, 224, 352])
def test_tails_of_one_to_three_blocks_give_each_row_its_bits(mod, bits, k):  # noqa: F811
    """K below one 128-value step, and one or two whole steps then 96 values (groups of 32):
    every row count 1..9 against each row alone, on each ISA, and the ISAs against each other."""
    rng = np.random.default_rng(bits * 10 + k)
    q = _quantized(rng, 13, k, 32, bits)
    x = mx.array(rng.standard_normal((9, k), dtype=np.float32))
    before, per_isa = mod.isa(), []
    try:
        for isa in _int8_isas(mod):
            mod.set_isa(isa)
            alone = mx.concatenate([quantized_small_matmul_native(x[r:r + 1], *q, 32, bits, q8=True)
                                    for r in range(9)])
            for m in range(1, 10):
                y = quantized_small_matmul_native(x[:m], *q, 32, bits, q8=True)
                assert mx.array_equal(y, alone[:m]).item(), (isa, m)
            _within_twin(alone, x, q, 32, bits)
            per_isa.append(alone)
    finally:
        mod.set_isa(before)
    assert all(mx.array_equal(per_isa[0], other).item() for other in per_isa[1:])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [False, True])
def test_many_rows_over_a_long_k_give_each_row_its_bits(mod, bits, symmetric):  # noqa: F811
    """The VNNI form's wide form (16 columns in column lanes, from ``kQ8WideRows`` rows on):
    K over more than one of its chunks (9.25 steps of 128) with a ragged last step, 50
    columns (three blocks of 16, two columns left to the quads), and more rows than one group
    of its accumulators (33 and 40): each row gets the bits it gets alone, on each ISA."""
    rng = np.random.default_rng(bits + 2 * symmetric)
    k = 1184
    w = rng.standard_normal((50, k), dtype=np.float32)
    q = list(mx.quantize(mx.array(w), group_size=32, bits=bits))
    if symmetric:  # every bias -2^(bits - 1) times its scale: made from the scales (b null)
        q[2] = q[1] * -float(1 << (bits - 1))
        assert symmetric_biases(q[1], q[2], bits)
    x = mx.array(rng.standard_normal((40, k), dtype=np.float32))
    before, per_isa = mod.isa(), []
    try:
        for isa in _int8_isas(mod):
            mod.set_isa(isa)
            alone = mx.concatenate([quantized_small_matmul_native(x[r:r + 1], *q, 32, bits,
                                                                  q8=True, symmetric=symmetric)
                                    for r in range(40)])
            for m in (8, 9, 16, 17, 31, 32, 33, 40):
                y = quantized_small_matmul_native(x[:m], *q, 32, bits, q8=True,
                                                  symmetric=symmetric)
                assert mx.array_equal(y, alone[:m]).item(), (isa, m)
            per_isa.append(alone)
    finally:
        mod.set_isa(before)
    assert all(mx.array_equal(per_isa[0], other).item() for other in per_isa[1:])


@pytest.mark.parametrize("k, group_size", [(160, 32), (192, 64), (1056, 32), (256, 32)])
def test_a_zero_keeps_its_sign_bit_in_every_form(mod, k, group_size):  # noqa: F811
    """Outputs that underflow to zero (tiny x and scales, zero weights) get the sign bit each
    row gets alone, in the wide form (9 rows) as in the quads: where K ends inside a step, the
    positions past K add +0 in both, so a -0 sum comes out +0 alike."""
    n, bits, m = 16, 4, 9
    wq = mx.array(np.zeros((n, k * bits // 32), dtype=np.uint32))
    scales = mx.array(np.full((n, k // group_size), 1e-9, dtype=np.float32))
    biases = mx.array(np.full((n, k // group_size), -1e-9, dtype=np.float32))
    x = mx.array(np.full((m, k), 1e-38, dtype=np.float32))
    before = mod.isa()
    try:
        for isa in _int8_isas(mod):
            mod.set_isa(isa)
            y = quantized_small_matmul_native(x, wq, scales, biases, group_size, bits, q8=True)
            alone = quantized_small_matmul_native(x[:1], wq, scales, biases, group_size, bits,
                                                  q8=True)
            got = np.asarray(y).view(np.uint32)
            assert (got == np.asarray(alone).view(np.uint32)[0]).all(), (isa, k)
    finally:
        mod.set_isa(before)


@pytest.mark.parametrize("seed", range(6))
def test_shapes_scales_and_threads_within_the_twin(mod, seed):  # noqa: F811
    """Random shapes (columns in many chunks over the pool's threads, ragged blocks) and x
    scales; the first and last rows alone keep their bits."""
    rng = np.random.default_rng(seed)
    bits, gs = int(rng.choice([4, 8])), int(rng.choice([32, 64, 128]))
    n, k, m = int(rng.choice([1, 5, 130, 3001])), gs * int(rng.integers(1, 13)), int(rng.integers(1, 41))
    q = _quantized(rng, n, k, gs, bits)
    x = mx.array(rng.standard_normal((m, k), dtype=np.float32) * rng.uniform(0.01, 10))
    before = mod.isa()
    try:
        for isa in _int8_isas(mod):
            mod.set_isa(isa)
            y = quantized_small_matmul_native(x, *q, gs, bits, q8=True)
            _within_twin(y, x, q, gs, bits)
            for r in {0, m - 1}:
                one = quantized_small_matmul_native(x[r:r + 1], *q, gs, bits, q8=True)
                assert mx.array_equal(one, y[r:r + 1]).item(), (isa, r)
    finally:
        mod.set_isa(before)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_symmetric_biases_made_from_the_scales_give_the_same_bits(mod, bits, group_size):  # noqa: F811
    """Weights whose biases are -2^(bits - 1) times their scales (GGUF's Q8_0, Q4_0): with
    ``symmetric`` the VNNI form makes the biases from the scales; every row count, and K ending
    inside a step, gives the bits of the same product reading the biases, on every ISA."""
    rng = np.random.default_rng(bits + group_size)
    k = {32: 160, 64: 192, 128: 384}[group_size]
    wq, scales, _ = _quantized(rng, 37, k, group_size, bits)
    biases = scales * -float(2 ** (bits - 1))
    assert symmetric_biases(scales, biases, bits)
    assert not symmetric_biases(scales, biases + 1e-3, bits)
    x = mx.array(rng.standard_normal((20, k), dtype=np.float32))
    before = mod.isa()
    try:
        for isa in _int8_isas(mod):
            mod.set_isa(isa)
            for m in (1, 2, 3, 4, 5, 8, 13, 16, 20):
                args = (x[:m], wq, scales, biases, group_size, bits)
                read = quantized_small_matmul_native(*args, q8=True)
                made = quantized_small_matmul_native(*args, q8=True, symmetric=True)
                assert mx.array_equal(read, made).item(), (isa, m)
    finally:
        mod.set_isa(before)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [3, 11])
def test_a_non_finite_value_gives_nan_in_its_row_only(mod, bits, rows):  # noqa: F811
    """Rows 1 and 2 hold a NaN and an infinity; the others stay finite (3 rows: one pass of the
    VNNI form's lane kernel; 11: a pass of 8 rows, then one of 3)."""
    q = _quantized(np.random.default_rng(6), 8, 128, 32, bits)
    xn = np.random.default_rng(7).standard_normal((rows, 128), dtype=np.float32)
    xn[1, 40], xn[2, 70] = np.nan, np.inf
    bad = np.zeros(rows, dtype=bool)
    bad[1:3] = True
    before = mod.isa()
    try:
        for isa in _int8_isas(mod):
            mod.set_isa(isa)
            y = np.array(quantized_small_matmul_native(mx.array(xn), *q, 32, bits, q8=True))
            assert np.isfinite(y[~bad]).all() and np.isnan(y[bad]).all(), isa
    finally:
        mod.set_isa(before)


@pytest.mark.parametrize("bits", [4, 8])
def test_ties_zero_blocks_and_tiny_scales_round_alike_on_every_isa(mod, bits):  # noqa: F811
    """The AVX-512 rounding of x and the portable one (the AVX2 form's) agree where rounding is
    delicate: halves (amax 127 gives d = 1, so x.5 ties to even), all-zero blocks (d = 0),
    subnormal blocks and -0.0."""
    K = 256
    q = _quantized(np.random.default_rng(8), 12, K, 32, bits)
    xn = np.zeros((4, K), dtype=np.float32)
    xn[0] = np.arange(K) % 64 - 31.5  # halves; each block's amax is 31.5 or 32.5
    xn[0, ::32] = 127.0  # amax 127: d = 1, so every x.5 is a tie
    xn[1, :32] = -0.0  # block 0 of row 1 all zero (d = 0); the rest ties too
    xn[1, 32:] = np.tile(np.arange(-112.5, 112.5, 1.0, dtype=np.float32)[:224], 1)
    xn[1, 32::32] = -127.0
    xn[2] = np.float32(1e-40) * (np.arange(K) % 7 - 3)  # subnormal values
    xn[3] = np.random.default_rng(9).standard_normal(K).astype(np.float32)
    before, got = mod.isa(), []
    try:
        for isa in _int8_isas(mod):
            mod.set_isa(isa)
            got.append(np.array(quantized_small_matmul_native(mx.array(xn), *q, 32, bits,
                                                              q8=True)))
    finally:
        mod.set_isa(before)
    assert got and np.isfinite(got[0]).all()
    assert all(np.array_equal(got[0], other) for other in got[1:])
    _within_twin(got[0], mx.array(xn), q, 32, bits)


def test_int8_activations_are_the_default_and_can_be_turned_off(mod, monkeypatch):  # noqa: F811
    q = _quantized(np.random.default_rng(4), 64, 256, 32, 4)
    x = mx.array(np.random.default_rng(5).standard_normal((3, 256), dtype=np.float32))
    float_way = quantized_small_matmul_native(x, *q, 32, 4)
    monkeypatch.delenv(backend.Q8_ENV, raising=False)
    assert backend.q8_activations_requested()
    monkeypatch.setenv(backend.Q8_ENV, "yes")
    with pytest.raises(backend.KernelError, match="EDGESPEC_Q8_ACTIVATIONS='yes'"):
        backend.use_q8_activations(4)
    monkeypatch.setenv(backend.Q8_ENV, "0")
    assert not backend.use_q8_activations(4) and "float x" in backend.native_summary()
    assert mx.array_equal(quantized_small_matmul(x, *q, 32, 4), float_way).item()
    monkeypatch.delenv(backend.Q8_ENV)
    try:
        backend.set_q8_activations(False)  # the override wins over the environment
        assert not backend.use_q8_activations(4)
    finally:
        backend.set_q8_activations(None)
    if not mod.has_q8_activations():
        assert not backend.use_q8_activations(4)
        return
    assert backend.use_q8_activations(4)
    assert backend.use_q8_activations(8) == mod.q8_vnni()  # the AVX2 form's 8-bit: float x
    assert not backend.use_q8_activations(3)
    with backend.q8_scope(False):  # a forward whose rows are not bit-independent: float x
        assert not backend.use_q8_activations(4)
    assert backend.use_q8_activations(4)
    assert "int8 activations on" in backend.native_summary()
    got = quantized_small_matmul(x, *q, 32, 4)
    assert mx.array_equal(got, quantized_small_matmul_native(x, *q, 32, 4, q8=True)).item()
    assert not mx.array_equal(got, float_way).item()  # it did round x
