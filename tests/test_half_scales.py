"""Float16 scales and biases for the native quantized products (``qmatmul.half_scales``): the
kernels read them and give the bits they give with the same values as float32, on every ISA,
for 4 and 8 bits, every group size, symmetric or not, int8 or float activations and every
kind of row count; a quantized target whose scales are float16 numbers (as a converted GGUF's
are) streams float16 copies in its blocks and LM head and computes the same logits as with
float32 ones, before and after its weights are moved onto huge pages, while its modules keep
float32; scales that are not float16 numbers stay float32; mixed dtypes are refused by name."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec import doctor
from edgespec.kernels import backend, qmatmul
from edgespec.kernels.matmul import halves, linear
from edgespec.kernels.qmatmul import half_scales
from edgespec.targets import load_target
from edgespec.targets.weight_arena import pack_blocks
from edgespec.tree import DraftTree

from .test_kernels import mod  # noqa: F401  (the fixture: the module, or skip / fail)
from .test_qmatmul import _quantized_copy


def _float16_numbers(rng, shape, scale=1.0):
    return mx.array((rng.standard_normal(shape) * scale).astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_the_kernels_read_float16_scales_to_the_same_bits(mod, bits, group_size):  # noqa: F811
    """K ends inside a 128-value step, N inside a 4-column block; 1-33 rows (the int8 forms'
    passes of up to 8 rows, the float kernels' row blocks); each ISA, with and without int8."""
    rng = np.random.default_rng(bits * 100 + group_size)
    K, N = 3 * 128 + group_size, 4 * 5 + 3
    wq = mx.array(rng.integers(0, 2**32, (N, K * bits // 32), dtype=np.uint32))
    scales = _float16_numbers(rng, (N, K // group_size), 0.01)
    scales[0, 0] = 2.0**-20  # a subnormal float16 number, widened exactly too
    before = mod.isa()
    try:
        for isa in mod.supported_isas().split(","):
            assert mod.set_isa(isa)
            for symmetric in (False, True):
                biases = (scales * -float(2 ** (bits - 1)) if symmetric
                          else _float16_numbers(rng, scales.shape, 0.1))
                s16, b16 = half_scales(scales, biases)
                assert s16.dtype == b16.dtype == mx.float16
                for m in (1, 2, 3, 4, 5, 8, 9, 33):
                    x = mx.array(rng.standard_normal((m, K), dtype=np.float32))
                    for q8 in (False, True) if mod.has_q8_activations() else (False,):
                        want = mod.quantized_small_matmul(x, wq, scales, biases, group_size,
                                                          bits, q8, symmetric)
                        got = mod.quantized_small_matmul(x, wq, s16, b16, group_size, bits, q8,
                                                         symmetric)
                        np.testing.assert_array_equal(np.array(got), np.array(want),
                                                      err_msg=f"{isa} M={m} q8={q8}")
    finally:
        mod.set_isa(before)


def test_half_scales_only_where_every_value_is_a_float16_number():
    rng = np.random.default_rng(0)
    s, b = _float16_numbers(rng, (8, 4)), _float16_numbers(rng, (8, 4))
    got = half_scales(s, b)
    assert got is not None
    np.testing.assert_array_equal(np.array(got[0].astype(mx.float32)), np.array(s))
    np.testing.assert_array_equal(np.array(got[1].astype(mx.float32)), np.array(b))
    for bad in (0.1, 1e5, float("nan")):  # rounds, overflows, never equal
        assert half_scales(mx.concatenate([s[:-1], mx.full((1, 4), bad)]), b) is None
        assert half_scales(s, mx.concatenate([b[:-1], mx.full((1, 4), bad)])) is None
    assert half_scales(s.astype(mx.float16), b.astype(mx.float16)) is None  # not float32


def test_mixed_scale_dtypes_are_refused_by_name(mod):  # noqa: F811
    rng = np.random.default_rng(1)
    wq = mx.array(rng.integers(0, 2**32, (4, 8), dtype=np.uint32))
    s = _float16_numbers(rng, (4, 2))
    x = mx.ones((1, 64))
    with pytest.raises(ValueError, match="both float32 or both float16"):
        mod.quantized_small_matmul(x, wq, s.astype(mx.float16), s, 32, 4)
    with pytest.raises(ValueError, match="both float32 or both float16"):
        mod.quantized_small_matmul(x, wq, s.astype(mx.bfloat16), s.astype(mx.bfloat16), 32, 4)


def _logits(target) -> list[np.ndarray]:
    """A long prompt (the module path), a chain, a tree and one token."""
    cache = target.make_cache()
    ids = [(7 * i + 5) % 200 + 4 for i in range(90)]
    outs = [target.score(ids[:80], cache).logits]
    cache.commit()
    outs.append(target.score(ids[80:84], cache).logits)
    cache.commit()
    outs.append(target.score(DraftTree([ids[84], 9, 10, 11], [-1, 0, 0, 1]), cache).logits)
    cache.commit([0, 1])
    outs.append(target.score([7], cache).logits)
    return [np.array(o) for o in outs]


def _target(tiny_models, tmp_path, bits, symmetric, wide: bool, monkeypatch):
    path = _quantized_copy(tiny_models.path(layers=3), tmp_path / f"q{int(wide)}", bits,
                           symmetric)
    with monkeypatch.context() as m:
        if wide:
            m.setattr(qmatmul, "half_scales", lambda s, b: None)
        target = load_target(path, dtype="auto")
        halves(target.model.output_head())  # made inside the patch, whatever fuse did
    return target


@pytest.mark.parametrize("bits,symmetric", [(4, False), (8, True)])
@pytest.mark.parametrize("q8", [False, True])
def test_a_target_with_float16_scales_streams_them_and_keeps_its_bits(
        mod, tiny_models, tmp_path, bits, symmetric, q8, monkeypatch):  # noqa: F811
    if q8 and not mod.has_q8_activations():
        pytest.skip("no int8 activation kernels here")
    wide = _target(tiny_models, tmp_path, bits, symmetric, True, monkeypatch)
    half = _target(tiny_models, tmp_path, bits, symmetric, False, monkeypatch)
    assert wide.quantized and half.quantized
    # copies only where the int8 form reads them (AVX2's 8-bit products take float x)
    copied = backend.q8_form_runs(bits)
    read = mx.float16 if copied else mx.float32
    blocks = half.model.model.layers
    for block, other in zip(blocks, wide.model.model.layers):
        streamed = block.streamed()
        assert [a.dtype for a in streamed[1::3]] == [read] * 4  # scales
        assert [a.dtype for a in streamed[2::3]] == [read] * 4  # biases
        assert all(a.dtype == mx.float32 for a in other.streamed()[1::3])
        assert sum(a.dtype == mx.float16 for a in block._fused.native_args) == 8 * copied
        assert block.self_attn.q_proj.scales.dtype == mx.float32  # the modules keep float32
        assert block.mlp.down_proj.biases.dtype == mx.float32
    head = half.model.output_head()
    assert (halves(head) is not None) == copied and halves(wide.model.output_head()) is None
    copies = sum(a.nbytes for b in blocks for a in b.streamed() if a.dtype == mx.float16)
    copies += sum(a.nbytes for a in halves(head) or ())
    if not (symmetric and mod.q8_vnni()):  # there the biases go unread (the test below)
        assert doctor.streamed_bytes(wide) - doctor.streamed_bytes(half) == copies  # halved
    calls = []
    real = mod.quantized_small_matmul
    monkeypatch.setattr(mod, "quantized_small_matmul",
                        lambda x, w, s, *a: calls.append(s.dtype) or real(x, w, s, *a))
    h = mx.ones((1, head.weight.shape[1] * 32 // bits))
    np.testing.assert_array_equal(np.array(linear(head, h)),
                                  np.array(linear(wide.model.output_head(), h)))
    assert calls == [read, mx.float32]  # the LM head read float16 copies
    backend.set_q8_activations(q8)
    try:
        want = _logits(wide)
        for a, b in zip(_logits(half), want):
            np.testing.assert_array_equal(a, b)
        pack_blocks(blocks, chunk_bytes=1, min_bytes=0)  # moved: float16 there, float32 here
        assert [a.dtype for a in blocks[0].streamed()[1::3]] == [read] * 4
        assert blocks[0].self_attn.o_proj.scales.dtype == mx.float32
        assert blocks[0]._fused.current(blocks[0])
        for a, b in zip(_logits(half), want):
            np.testing.assert_array_equal(a, b)
    finally:
        backend.set_q8_activations(None)


def test_scales_that_are_not_float16_numbers_stay_float32(tiny_models, tmp_path):
    """A model quantized from float32 weights by MLX has float32 scales that float16 rounds."""
    import json
    import shutil

    src, out = tiny_models.path(layers=2), tmp_path / "q32"
    out.mkdir()
    weights = {}
    for k, v in mx.load(str(src / "model.safetensors")).items():
        if k.endswith(".weight") and v.ndim == 2 and v.shape[1] % 32 == 0:
            wq, s, b = mx.quantize(v.astype(mx.float32), group_size=32, bits=4)
            weights.update({k: wq, k[: -len("weight")] + "scales": s,
                            k[: -len("weight")] + "biases": b})
        else:
            weights[k] = v
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    config = json.loads((src / "config.json").read_text())
    config["quantization"] = {"group_size": 32, "bits": 4}
    (out / "config.json").write_text(json.dumps(config))
    for f in src.iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, out / f.name)
    target = load_target(out, dtype="auto")
    assert target.quantized
    for block in target.model.model.layers:
        assert block._fused.halves == {}
        assert all(a.dtype == mx.float32 for a in block.streamed()[1::3])
    assert halves(target.model.output_head()) is None


def test_no_copies_where_the_int8_form_does_not_read_them(tiny_models, tmp_path, monkeypatch):
    """Float activations (``EDGESPEC_Q8_ACTIVATIONS=0``) widen float16 values on every call,
    so a target loaded then keeps float32 ones only."""
    backend.set_q8_activations(False)
    try:
        target = load_target(_quantized_copy(tiny_models.path(layers=2), tmp_path / "q"),
                             dtype="auto")
        assert target.quantized
        for block in target.model.model.layers:
            assert block._fused.halves == {}
            assert all(a.dtype == mx.float32 for a in block.streamed()[1::3])
        assert halves(target.model.output_head()) is None
    finally:
        backend.set_q8_activations(None)


def test_avx2_copies_only_where_its_int8_form_runs(mod, tiny_models, tmp_path):  # noqa: F811
    """AVX2's int8 form takes 4-bit weights only (its 8-bit products run float x): a 4-bit
    target gets copies there, an 8-bit one keeps float32."""
    if "avx2" not in mod.supported_isas().split(","):
        pytest.skip("no AVX2 here")
    before = mod.isa()
    try:
        assert mod.set_isa("avx2")
        for bits, copied in ((4, True), (8, False)):
            target = load_target(_quantized_copy(tiny_models.path(layers=2),
                                                 tmp_path / f"q{bits}", bits), dtype="auto")
            assert backend.q8_form_runs(bits) == copied
            for block in target.model.model.layers:
                assert (block._fused.halves != {}) == copied
            assert (halves(target.model.output_head()) is not None) == copied
    finally:
        mod.set_isa(before)


def test_doctor_leaves_out_the_biases_the_vnni_form_makes(mod, tiny_models, tmp_path):  # noqa: F811
    """A symmetric 8-bit target (GGUF's Q8_0) on AVX-512 VNNI: a step reads the packed weights
    and float16 scales of every product, never their biases."""
    if not (mod.q8_vnni() and backend.q8_form_runs(8)):
        pytest.skip("the AVX-512 VNNI int8 form does not run here")
    from mlx.utils import tree_flatten

    target = load_target(_quantized_copy(tiny_models.path(layers=2), tmp_path / "q", 8, True),
                         dtype="auto")
    params = sum(v.nbytes for _, v in tree_flatten(target.model.parameters()))
    head = target.model.output_head()
    copies = [a for b in target.model.model.layers for a in b.streamed()[1::3]]  # scales
    copies += [a for b in target.model.model.layers for a in b.streamed()[2::3]]  # biases
    assert all(a.dtype == mx.float16 for a in copies)
    s16, b16 = halves(head)
    # each float16 copy saves its own bytes; the biases are not read at all
    unread = sum(a.nbytes for a in copies) + s16.nbytes + b16.nbytes
    unread += sum(a.nbytes for b in target.model.model.layers for a in b.streamed()[2::3])
    unread += b16.nbytes
    assert doctor.streamed_bytes(target) == params - unread
