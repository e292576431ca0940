"""The int8 forward's SiLU takes libm's exp, four lanes at a time: the same bits as the C library.

``exp_neg_libm`` is what that SiLU calls; its vector path (glibc's expf algorithm in double with
AVX2 and FMA) must give ``expf``'s own bits for every float, or down_proj's 8-bit rounding of
its result would flip against the twin's. Checked here against the C library's ``expf`` called
through ctypes on a spread of bit patterns of every sign and scale, the values around the edge
where the scalar call takes over (|x| >= 88), subnormal results, zeros, infinities and NaN.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct

import numpy as np
import pytest

from .test_kernels import mod  # noqa: F401  (the fixture: the module, or skip / fail)


def _libm_expf():
    name = ctypes.util.find_library("m")
    if name is None:
        pytest.skip("no C math library to compare with")
    f = ctypes.CDLL(name).expf
    f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float]
    return f


def _floats(bits: np.ndarray) -> list[float]:
    return bits.astype(np.uint32).view(np.float32).tolist()


def test_exp_neg_libm_gives_the_c_librarys_bits(mod):
    expf = _libm_expf()
    rng = np.random.default_rng(0)
    spread = np.arange(0, 1 << 32, 40_009, dtype=np.uint64)  # every sign, exponent and scale
    near_edge = np.concatenate([
        np.arange(0x42AF_FF00, 0x42B0_0100, dtype=np.uint64),  # 88.0 and its neighbours
        np.arange(0xC2AF_FF00, 0xC2B0_0100, dtype=np.uint64),  # -88.0
        np.arange(0xC2CE_0000, 0xC2CE_0400, dtype=np.uint64),  # ~ -103: e^-x overflows
        np.arange(0x42AE_0000, 0x42D0_0000, 4099, dtype=np.uint64),  # 87 .. 104: subnormal results
    ])
    small = rng.integers(0, 1 << 32, 20_000, dtype=np.uint64)
    special = np.array([0, 0x8000_0000, 0x7F80_0000, 0xFF80_0000, 0x7FC0_0000, 1, 0x8000_0001],
                       dtype=np.uint64)
    x = _floats(np.concatenate([spread, near_edge, small, special]))
    got = mod.exp_neg_libm(x)
    assert len(got) == len(x)
    bad = []
    for v, g in zip(x, got):
        want = expf(-v)
        if struct.pack("<f", g) != struct.pack("<f", want) and not (g != g and want != want):
            bad.append((v, g, want))
    assert not bad, f"{len(bad)} of {len(x)} differ from expf, e.g. {bad[:3]}"


def test_exp_neg_libm_every_length(mod):
    """Every count of values, the lanes past the last whole four included."""
    expf = _libm_expf()
    x = np.linspace(-20.0, 20.0, 37, dtype=np.float32).tolist()
    for n in range(len(x) + 1):
        got = mod.exp_neg_libm(x[:n])
        want = [expf(-v) for v in x[:n]]
        assert [struct.pack("<f", g) for g in got] == [struct.pack("<f", w) for w in want], n


def test_the_vector_path_runs_where_the_cpu_has_it(mod):
    """Off away from x86-64; on with AVX2 and FMA under Linux's glibc, whose expf the vector
    path's bits were checked against for every input (other C libraries may turn it off)."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        assert not mod.expf_vector_active()
        return
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("the vector path's bits are known for Linux's glibc only")
    with open("/proc/cpuinfo") as f:
        flags = f.read().split()
    if "avx2" in flags and "fma" in flags:
        assert mod.expf_vector_active()


def test_silu_libm_is_the_scalar_expression_bit_for_bit(mod):
    """gate / (1 + expf(-gate)) * up, each a float32 IEEE operation, for gates of every scale,
    the lanes that take the scalar exp (|gate| >= 88, infinities, NaN) mixed among the others,
    and every count of values (the last partial four)."""
    expf = _libm_expf()
    rng = np.random.default_rng(1)
    gate = np.concatenate([
        rng.normal(0, 3, 3000), rng.normal(0, 60, 600), [88.0, -88.0, 87.99, -87.99, 1e30,
                                                          -1e30, np.inf, -np.inf, np.nan, 0.0]
    ]).astype(np.float32)
    rng.shuffle(gate)
    up = rng.normal(0, 2, gate.size).astype(np.float32)
    e = np.array([expf(-float(g)) for g in gate], dtype=np.float32)
    with np.errstate(all="ignore"):
        want = (gate / (np.float32(1) + e)) * up
    for n in (gate.size, 1, 2, 3, 4, 5, 7, 9):
        got = np.array(mod.silu_libm(gate[:n].tolist(), up[:n].tolist()), dtype=np.float32)
        np.testing.assert_array_equal(got.view(np.uint32), want[:n].view(np.uint32), err_msg=str(n))
