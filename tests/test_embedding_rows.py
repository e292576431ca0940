"""A quantized embedding's rows as one native operation (``native.quantized_rows``, through
``kernels/qmatmul.embedding_rows``) against ``nn.QuantizedEmbedding`` itself, its twin: the same
bits for 4 and 8 bits, groups of 32, 64 and 128, int32 and uint32 ids of any shape (argmax
gives uint32: a pipelined plain step embeds its lazy next token); a row of NaN for an id
outside the table; bad arguments named; a quantized target embeds through it and gets the
module's bits; where the native kernels do not run, the module runs."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from edgespec.kernels import backend
from edgespec.kernels.qmatmul import embedding_rows
from edgespec.targets import load_target

from .test_kernels import mod  # noqa: F401  (the fixture: the module, or skip / fail)


def _bits(a: mx.array) -> np.ndarray:
    return np.asarray(a).view(np.uint32)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_the_rows_have_the_modules_bits(mod, bits, group_size):  # noqa: F811
    rng = np.random.default_rng(bits * 1000 + group_size)
    table = nn.QuantizedEmbedding(1000, 384, group_size=group_size, bits=bits)
    table.update({"scales": table.scales * mx.array(rng.uniform(0.1, 3, (1000, 1)),
                                                    dtype=mx.float32)})
    for shape in ((5,), (1, 7), (2, 3)):
        ids = rng.integers(0, 1000, shape)
        ids[..., 0] = 999  # the last row and the first
        ids.flat[-1] = 0
        for dtype in (mx.int32, mx.uint32):
            x = mx.array(ids.astype(np.int64), dtype=dtype)
            got = mod.quantized_rows(x, table.weight, table.scales, table.biases, group_size,
                                     bits)
            assert got.shape == (*shape, 384)
            assert (_bits(got) == _bits(table(x))).all(), (shape, dtype)
            assert (_bits(embedding_rows(table, x)) == _bits(table(x))).all()


def test_an_id_outside_the_table_gives_nan_and_bad_arguments_are_named(mod):  # noqa: F811
    table = nn.QuantizedEmbedding(10, 64, group_size=32, bits=4)
    rows = np.asarray(mod.quantized_rows(mx.array([-1, 3, 10], dtype=mx.int32), table.weight,
                                         table.scales, table.biases, 32, 4))
    assert np.isnan(rows[0]).all() and np.isnan(rows[2]).all() and np.isfinite(rows[1]).all()
    with pytest.raises(ValueError, match="int32 or uint32 ids"):
        mod.quantized_rows(mx.array([1.0]), table.weight, table.scales, table.biases, 32, 4)
    with pytest.raises(ValueError, match="quantized_rows: bits must be 4 or 8"):
        mod.quantized_rows(mx.array([1]), table.weight, table.scales, table.biases, 32, 3)
    with pytest.raises(ValueError, match="group_size must be 32, 64 or 128"):
        mod.quantized_rows(mx.array([1]), table.weight, table.scales, table.biases, 16, 4)
    with pytest.raises(ValueError, match="K / group_size"):
        mod.quantized_rows(mx.array([1]), table.weight, table.scales, table.biases, 64, 4)


def test_other_layouts_take_the_module(mod):  # noqa: F811
    """2 and 3 bits (a quantized self-draft's) and float16 scales are the module's."""
    ids = mx.array([1, 2], dtype=mx.int32)
    for kw, half in (({"bits": 3, "group_size": 32}, False), ({"bits": 2, "group_size": 64}, False),
                     ({"bits": 4, "group_size": 32}, True)):
        table = nn.QuantizedEmbedding(10, 64, **kw)
        if half:
            table.update({"scales": table.scales.astype(mx.float16),
                          "biases": table.biases.astype(mx.float16)})
        assert (_bits(embedding_rows(table, ids)) == _bits(table(ids))).all(), kw


def test_a_quantized_target_embeds_with_the_modules_bits(mod, tiny_models, tmp_path,  # noqa: F811
                                                         monkeypatch):
    from .test_qmatmul import _quantized_copy

    target = load_target(_quantized_copy(tiny_models.path(layers=2), tmp_path / "q", 4, False),
                         dtype="auto")
    table = target.model.model.embed_tokens
    assert type(table) is nn.QuantizedEmbedding
    ids = mx.array([[0, 5, target.args.vocab_size - 1, 17]], dtype=mx.int32)
    want = table(ids)
    calls = []
    real = mod.quantized_rows

    class Spy:
        def __getattr__(self, name):
            return getattr(mod, name)

        def quantized_rows(self, *a):
            calls.append(a[0].shape)
            return real(*a)

    import edgespec.kernels.qmatmul as qmatmul

    with monkeypatch.context() as patched:
        patched.setattr(qmatmul.native, "load", lambda: Spy())
        got = target.model.embed(ids)
    assert calls == [(1, 4)] and (_bits(got) == _bits(want)).all()
    backend.set_native_enabled(False)
    try:
        assert (_bits(target.model.embed(ids)) == _bits(want)).all()  # the module itself
    finally:
        backend.set_native_enabled(True)
