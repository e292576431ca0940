"""The native quantized small-M matmul (kernels/qmatmul.py) against its pure-MLX twin.

Tolerance (stated in kernels/qmatmul.py): per output within 1e-5 * sum_k |x_k w_k| of the
twin, w the dequantized weights. The float-activation forms here (the int8 ones:
tests/test_qmatmul_int8.py). Skips like tests/test_kernels.py where the extension cannot be
built; the AVX-512 and AVX2 code is checked where the CPU has it, the plain C++ code everywhere.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.kernels import backend
from edgespec.kernels.matmul import linear
from edgespec.kernels.qmatmul import (quantized_small_matmul, quantized_small_matmul_mlx,
                                      quantized_small_matmul_native)

from .test_kernels import mod  # noqa: F401  (the fixture: the module, or skip / fail)

RTOL_ABS_SUM = 1e-5


def _quantized(rng, n: int, k: int, group_size: int, bits: int):
    w = mx.array(rng.standard_normal((n, k), dtype=np.float32))
    return mx.quantize(w, group_size=group_size, bits=bits)


def _close(y, x, q, group_size, bits):
    w = np.array(mx.dequantize(*q, group_size=group_size, bits=bits), dtype=np.float64)
    xn = np.array(x, dtype=np.float64).reshape(-1, w.shape[1])
    bound = RTOL_ABS_SUM * (np.abs(xn) @ np.abs(w).T) + 1e-30
    got = np.array(y).reshape(xn.shape[0], -1)
    twin = np.array(quantized_small_matmul_mlx(x, *q, group_size, bits)).reshape(got.shape)
    assert (np.abs(got - twin) <= bound).all(), np.abs(got - twin).max()
    assert (np.abs(got - xn @ w.T) <= bound).all()


@settings(max_examples=40, deadline=None, derandomize=True)
@given(m=st.integers(1, 64), n=st.sampled_from([1, 3, 4, 5, 17, 130, 1001]),
       groups=st.integers(1, 12), group_size=st.sampled_from([32, 64, 128]),
       bits=st.sampled_from([4, 8]), seed=st.integers(0, 2**31 - 1))
def test_kernel_equals_twin(mod, m, n, groups, group_size, bits, seed):  # noqa: F811
    """Within tolerance of the twin on every ISA, and the first and last rows have the bits
    they get alone (every path: one row, 4-row blocks, a chunk dequantized for the float
    kernel from 9 rows)."""
    rng = np.random.default_rng(seed)
    k = groups * group_size
    q = _quantized(rng, n, k, group_size, bits)
    x = mx.array(rng.standard_normal((m, k), dtype=np.float32))
    before = mod.isa()
    try:
        for isa in _isas(mod):
            mod.set_isa(isa)
            y = quantized_small_matmul_native(x, *q, group_size, bits)
            _close(y, x, q, group_size, bits)
            for r in {0, m - 1}:
                alone = quantized_small_matmul_native(x[r : r + 1], *q, group_size, bits)
                assert mx.array_equal(alone, y[r : r + 1]).item(), (isa, r)
    finally:
        mod.set_isa(before)


def test_views_of_larger_buffers_read_the_same(mod):  # noqa: F811
    """Weights as row ranges of larger arrays (as targets/weight_arena places them: taken as
    they are, not copied) and as strided views (copied first) give the products of copies."""
    rng = np.random.default_rng(7)
    q = _quantized(rng, 300, 256, 32, 8)
    x = mx.array(rng.standard_normal((12, 256), dtype=np.float32))
    want = quantized_small_matmul_native(x, *q, 32, 8)
    padded = [mx.concatenate([mx.zeros((5, a.shape[1]), a.dtype), a,
                              mx.zeros((7, a.shape[1]), a.dtype)]) for a in q]
    mx.eval(padded)
    rows = [a[5:305] for a in padded]
    wide = [mx.concatenate([a, a], axis=1) for a in q]
    mx.eval(rows, wide)
    strided = [a[:, : a.shape[1] // 2] for a in wide]
    for views in (rows, strided):
        assert mx.array_equal(quantized_small_matmul_native(x, *views, 32, 8), want).item()
        assert mx.array_equal(quantized_small_matmul_native(x[:1], *views, 32, 8), want[:1]).item()


def _isas(mod):
    return [i for i in ("avx512", "avx2", "generic") if i in mod.supported_isas().split(",")]


def test_both_isas_rows_invariant_and_threaded(mod):  # noqa: F811
    """Every ISA, with the weights dequantized per 4-row block and once for all rows (the
    default on Intel CPUs): within tolerance of the twin, and a row alone has its bits in a
    batch of 7 (a ragged last block), of 9 and 18 (unbuffered: a chunk dequantized for the
    float kernel; buffered: the buffered path) and of 80 (the float kernel either way, over two
    slabs of x's rows)."""
    rng = np.random.default_rng(1)
    before, buffered = mod.isa(), mod.buffered_dequantization()
    try:
        for isa in _isas(mod):
            mod.set_isa(isa)
            for bits in (4, 8):
                q = _quantized(rng, 3001, 576, 64, bits)  # threaded: many chunks, a ragged one
                x = mx.array(rng.standard_normal((2, 9, 576), dtype=np.float32))
                many = mx.array(rng.standard_normal((80, 576), dtype=np.float32))
                alone = quantized_small_matmul_native(x[1, 4:5], *q, 64, bits)
                results = []
                for on in (False, True):
                    mod.set_buffered_dequantization(on)
                    y = quantized_small_matmul_native(x, *q, 64, bits)
                    assert y.shape == (2, 9, 3001)
                    _close(y, x, q, 64, bits)
                    assert mx.array_equal(alone, y[1, 4:5]).item(), (isa, bits, on)
                    for rows in (7, 9):
                        part = quantized_small_matmul_native(x[1, :rows], *q, 64, bits)
                        assert mx.array_equal(part, y[1, :rows]).item(), (isa, bits, on, rows)
                    y80 = quantized_small_matmul_native(many, *q, 64, bits)
                    _close(y80, many, q, 64, bits)
                    for r in (0, 70):
                        one = quantized_small_matmul_native(many[r:r + 1], *q, 64, bits)
                        assert mx.array_equal(one, y80[r:r + 1]).item(), (isa, bits, on, r)
                    results.append(y)
                assert mx.array_equal(*results).item()
    finally:
        mod.set_isa(before)
        mod.set_buffered_dequantization(buffered)


def test_bad_layouts_raise_kernel_error(mod):  # noqa: F811
    q = _quantized(np.random.default_rng(2), 8, 128, 64, 4)
    with pytest.raises(backend.KernelError, match="bits must be 4 or 8"):
        quantized_small_matmul_native(mx.ones((1, 128)), *q, 64, 3)
    with pytest.raises(backend.KernelError, match=r"shapes do not match.*x \(1, 96\)"):
        quantized_small_matmul_native(mx.ones((1, 96)), *q, 64, 4)


def test_quantized_heads_go_through_the_kernel(mod, monkeypatch):  # noqa: F811
    """``matmul.linear`` sends affine quantized heads (tied embedding or linear) to the kernel
    on AVX-512 and AVX2 CPUs, and with float activations gives what the module gives."""
    monkeypatch.setenv(backend.Q8_ENV, "0")
    calls = []
    real = mod.quantized_small_matmul
    monkeypatch.setattr(mod, "quantized_small_matmul", lambda *a: calls.append(a[0].shape) or real(*a))
    mx.random.seed(3)
    x = mx.random.normal((4, 128))
    qemb = nn.QuantizedEmbedding.from_embedding(nn.Embedding(300, 128), group_size=64, bits=4)
    qlin = nn.QuantizedLinear.from_linear(nn.Linear(128, 50, bias=False), group_size=32, bits=8)
    for module, want in ((qemb, qemb.as_linear(x)), (qlin, qlin(x))):
        assert mx.allclose(linear(module, x), want, rtol=1e-4, atol=1e-3).item()
    expect = 2 if mod.isa() in ("avx512", "avx2") else 0
    assert len(calls) == expect
    backend.set_native_enabled(False)
    try:
        assert mx.array_equal(quantized_small_matmul(x, qlin["weight"], qlin["scales"], qlin["biases"], 32, 8),
                              qlin(x)).item()
    finally:
        backend.set_native_enabled(True)
    assert len(calls) == expect


def _quantized_copy(src, out, bits: int = 4, symmetric: bool = False):
    """``src`` (a tiny float model) with its matrices quantized to ``bits``, float16
    scales/biases as a converted GGUF has them (``symmetric``: every bias -2^(bits - 1) times
    its scale, as GGUF's Q8_0 is converted)."""
    import json
    import shutil

    out.mkdir()
    weights = {}
    for k, v in mx.load(str(src / "model.safetensors")).items():
        if k.endswith(".weight") and v.ndim == 2 and v.shape[1] % 32 == 0:
            wq, s, b = mx.quantize(v, group_size=32, bits=bits)
            base = k[: -len(".weight")]
            s = s.astype(mx.float16)
            b = s * -float(2 ** (bits - 1)) if symmetric else b.astype(mx.float16)
            weights.update({k: wq, f"{base}.scales": s, f"{base}.biases": b})
        else:
            weights[k] = v
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    config = json.loads((src / "config.json").read_text())
    config["quantization"] = {"group_size": 32, "bits": bits}
    (out / "config.json").write_text(json.dumps(config))
    for f in src.iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, out / f.name)
    return out


@pytest.mark.parametrize("q8,bits", [(False, 4), (True, 4), (True, 8)])
def test_a_quantized_target_decodes_through_the_kernel(mod, tiny_models, tmp_path, monkeypatch,  # noqa: F811
                                                       q8, bits):
    """Kept quantized on the CPU: packed weights, float32 everything else, every product
    through the kernel (a forward of more tokens than the native block takes too), and greedy
    speculation (lookup, lookahead, the model drafting for itself with its early layers) equal
    to plain decoding of the same model, with float and (the default) int8 activations."""
    from edgespec import Engine
    from edgespec.config import SamplingConfig
    from edgespec.drafters.registry import make_drafter
    from edgespec.options import spec_for
    from edgespec.targets import load_target

    if q8 and not mod.has_q8_activations():
        pytest.skip("no int8 form for this CPU")
    if q8 and bits == 8 and not mod.q8_vnni():
        pytest.skip("8-bit weights take float x without the VNNI form (backend.use_q8_activations)")
    if q8:
        monkeypatch.delenv(backend.Q8_ENV, raising=False)  # the default
    else:
        monkeypatch.setenv(backend.Q8_ENV, "0")
    assert backend.use_q8_activations(bits) == q8
    target = load_target(_quantized_copy(tiny_models.path(layers=2), tmp_path / "q", bits),
                         dtype="auto")
    assert target.quantized
    layer = target.model.model.layers[0].mlp
    params = dict(tree_flatten(layer.parameters()))
    assert {v.dtype for k, v in params.items() if k.endswith((".scales", ".biases"))} == {mx.float32}
    calls = []
    real = mod.quantized_small_matmul
    modes = set()
    monkeypatch.setattr(mod, "quantized_small_matmul",
                        lambda *a: calls.append(a[0].shape) or modes.add(a[6]) or real(*a))
    prompt = "the cat sat on the mat and the cat sat on the"
    plain = Engine(target).generate(prompt, max_tokens=24)
    assert calls  # the LM head; the blocks ran as native blocks, their products in C++
    calls.clear()
    target.score(list(range(3, 3 + backend.SMALL_M_MAX + 8)), target.make_cache())
    assert min(math.prod(s[:-1]) for s in calls) > backend.SMALL_M_MAX  # MLX's block, the op
    assert modes == {q8}
    greedy = SamplingConfig()
    for method, given in (("lookup", {}), ("lookahead", {}), ("early-exit", {"exit_layer": 1})):
        engine = Engine(target, make_drafter(spec_for(method, given), target, greedy), greedy)
        assert engine.generate(prompt, max_tokens=24).token_ids == plain.token_ids, method
