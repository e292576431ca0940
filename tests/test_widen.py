"""Weights of widths the native products lack, re-packed at one they take (``widen_for_native``):
the same weights bit for bit, and a target loaded with them runs every product natively."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from edgespec.kernels import backend, qmatmul
from edgespec.kernels.qmatmul import native_width, widen_for_native, widen_packed

from .test_kernels import mod  # noqa: F401  (the fixture: the module, or skip / fail)
from .test_qmatmul import _quantized_copy


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_widened_weights_dequantize_to_the_same_bits(bits, group_size):
    w = mx.random.normal((37, 384), key=mx.random.key(bits * 1000 + group_size))
    wq, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
    want = mx.dequantize(wq, scales, biases, group_size, bits)
    for to in (4, 8):
        if to < bits:
            continue
        wide = widen_packed(wq, bits, to)
        assert wide.dtype == mx.uint32 and wide.shape == (37, 384 * to // 32)
        assert mx.array_equal(mx.dequantize(wide, scales, biases, group_size, to), want), to


def test_widening_in_chunks_gives_the_same_array(monkeypatch):
    w = mx.random.normal((29, 256), key=mx.random.key(3))
    wq, _, _ = mx.quantize(w, group_size=32, bits=5)
    whole = widen_packed(wq, 5, 8)
    monkeypatch.setattr(qmatmul, "_WIDEN_CHUNK", 3 * 256)  # 3 rows at a time: 10 chunks
    assert mx.array_equal(widen_packed(wq, 5, 8), whole)


def test_native_width_and_bad_widths():
    assert [native_width(b) for b in (1, 2, 3, 4, 5, 6, 8, 16)] == [4, 4, 4, 4, 8, 8, 8, None]
    wq = mx.zeros((2, 10), dtype=mx.uint32)  # 64 values of 5 bits
    with pytest.raises(ValueError, match="cannot widen 5-bit weights to 4 bits"):
        widen_packed(wq, 5, 4)
    with pytest.raises(ValueError, match="cannot widen 5-bit weights to 6 bits"):
        widen_packed(wq, 5, 6)


def test_only_affine_layers_of_other_widths_are_widened():
    model = nn.Sequential(*[nn.QuantizedLinear.from_linear(nn.Linear(64, 32), 32, b)
                            for b in (5, 4, 3, 8)], nn.Linear(64, 32))  # a float layer too
    before = [mx.dequantize(q["weight"], q["scales"], q["biases"], q.group_size, q.bits)
              for q in model.layers[:4]]
    assert widen_for_native(model) == {(5, 8): 1, (3, 4): 1}
    assert [q.bits for q in model.layers[:4]] == [8, 4, 4, 8]
    for q, want in zip(model.layers[:4], before):
        got = mx.dequantize(q["weight"], q["scales"], q["biases"], q.group_size, q.bits)
        assert mx.array_equal(got, want)
    x = mx.random.normal((3, 64), key=mx.random.key(0))
    assert model.layers[0](x).shape == (3, 32)  # the module's own product reads the new width


def test_what_was_made_for_the_old_width_is_made_again(mod):  # noqa: F811
    """A Q5_0-like layer (every bias -16 times its scale: symmetric at 5 bits, not at 8) that
    ran once before it was re-packed computes the re-packed product, not the 5-bit form's."""
    from edgespec.kernels.matmul import linear, symmetric

    layer = nn.QuantizedLinear.from_linear(nn.Linear(256, 48, bias=False), 32, 5)
    layer.biases = layer.scales * -16.0
    x = mx.random.normal((2, 256), key=mx.random.key(4))
    assert symmetric(layer)
    linear(layer, x)
    model = nn.Sequential(layer)
    assert widen_for_native(model) == {(5, 8): 1}
    assert not symmetric(layer)
    # the twin of whichever form runs (int8 x where it does: x rounded the same way)
    twin = (qmatmul.quantized_small_matmul_q8_mlx if backend.use_q8_activations(8)
            else qmatmul.quantized_small_matmul_mlx)
    want = twin(x, layer["weight"], layer["scales"], layer["biases"], 32, 8)
    np.testing.assert_allclose(np.array(linear(layer, x)), np.array(want), atol=1e-3, rtol=1e-4)


def test_nothing_is_re_packed_where_the_native_kernels_do_not_run(tiny_models, tmp_path,
                                                                 monkeypatch):
    import sys

    from edgespec.targets import load_target

    loading = sys.modules["edgespec.targets.load"]
    monkeypatch.setattr(loading, "native_enabled", lambda: False)
    target = load_target(_quantized_copy(tiny_models.path(layers=2), tmp_path / "q", 5),
                         dtype="auto")
    assert target.model.widened == {}
    assert target.model.model.layers[0].mlp.up_proj.bits == 5


@pytest.mark.parametrize("bits,to", [(5, 8), (3, 4)])
def test_a_target_of_another_width_runs_natively_and_speculates_exactly(
        mod, tiny_models, tmp_path, monkeypatch, bits, to):  # noqa: F811
    """Loaded kept quantized on the CPU: its products (and the embedding) re-packed at ``to``
    bits with the file's weights, every product through the native kernel, logits close to
    MLX's own product of the file's width, and greedy speculation equal to plain decoding."""
    import sys

    from edgespec import Engine
    from edgespec.config import SamplingConfig
    from edgespec.drafters.registry import make_drafter
    from edgespec.options import spec_for
    from edgespec.targets import load_target

    path = _quantized_copy(tiny_models.path(layers=2), tmp_path / "q", bits)
    target = load_target(path, dtype="auto")
    layers = [m for _, m in target.model.named_modules()
              if type(m) in (nn.QuantizedLinear, nn.QuantizedEmbedding)]
    assert layers and {m.bits for m in layers} == {to}
    assert target.model.widened == {(bits, to): len(layers)}
    files = mx.load(str(path / "model.safetensors"))
    up = target.model.model.layers[0].mlp.up_proj
    stem = "model.layers.0.mlp.up_proj"
    want = mx.dequantize(files[stem + ".weight"], files[stem + ".scales"].astype(mx.float32),
                         files[stem + ".biases"].astype(mx.float32), 32, bits)
    assert mx.array_equal(mx.dequantize(up["weight"], up["scales"], up["biases"], 32, to), want)

    # MLX's own product of the file's width (widening off) is the reference
    loading = sys.modules["edgespec.targets.load"]
    monkeypatch.setattr(loading, "widen_for_native", lambda model: {})
    own = load_target(path, dtype="auto")
    assert own.model.model.layers[0].mlp.up_proj.bits == bits
    monkeypatch.undo()
    ids = list(range(5, 21))
    monkeypatch.setenv("EDGESPEC_Q8_ACTIVATIONS", "0")  # float x: comparable with MLX's product
    got = np.array(target.score(ids, target.make_cache()).logits)
    ref = np.array(own.score(ids, own.make_cache()).logits)
    np.testing.assert_allclose(got, ref, atol=2e-3, rtol=1e-3)
    monkeypatch.delenv("EDGESPEC_Q8_ACTIVATIONS")

    calls = []
    real = mod.quantized_small_matmul
    monkeypatch.setattr(mod, "quantized_small_matmul",
                        lambda *a: calls.append(a[5]) or real(*a))
    prompt = "the cat sat on the mat and the cat sat on the"
    plain = Engine(target).generate(prompt, max_tokens=24)
    assert calls and set(calls) == {to}  # the LM head at least; the blocks ran as native blocks
    greedy = SamplingConfig()
    for method in ("lookup", "lookahead"):
        engine = Engine(target, make_drafter(spec_for(method, {}), target, greedy), greedy)
        assert engine.generate(prompt, max_tokens=24).token_ids == plain.token_ids, method


def _v_wider(src, out):
    """``src`` (a tiny float model) quantized as a GGUF Q4_K_M's layers load: 4 bits, v 8."""
    import json
    import shutil

    out.mkdir()
    weights, quant = {}, {"group_size": 32, "bits": 4}
    for k, v in mx.load(str(src / "model.safetensors")).items():
        if k.endswith(".weight") and v.ndim == 2 and v.shape[1] % 32 == 0:
            base = k[: -len(".weight")]
            bits = 8 if base.endswith("v_proj") else 4
            if bits == 8:
                quant[base] = {"group_size": 32, "bits": 8}
            wq, s, b = mx.quantize(v, group_size=32, bits=bits)
            weights.update({k: wq, f"{base}.scales": s, f"{base}.biases": b})
        else:
            weights[k] = v
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    config = {**json.loads((src / "config.json").read_text()), "quantization": quant}
    (out / "config.json").write_text(json.dumps(config))
    for f in src.iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, out / f.name)
    return out


def test_a_block_whose_v_is_wider_than_q_and_k_runs_natively(mod, tiny_models, tmp_path,
                                                              monkeypatch):  # noqa: F811
    """A GGUF Q4_K_M's layout: q and k 4-bit, v 8-bit (Q6_K, rounded). Kept quantized, q and k
    are re-packed at 8 bits (``match_widths``: the same weights) so that the block joins
    q|k|v and runs as the native block; its logits equal the module path's on the file's
    widths (float x on both), and greedy lookup equals plain decoding."""
    import sys

    from edgespec import Engine
    from edgespec.drafters.lookup import PromptLookupDrafter
    from edgespec.targets import load_target

    out = _v_wider(tiny_models.path(layers=2), tmp_path / "mixed")
    target = load_target(out, dtype="auto")
    assert target.model.native_blocks() and target.model.widened == {(4, 8): 4}  # q, k of 2
    attn = target.model.model.layers[0].self_attn
    assert {attn.q_proj.bits, attn.k_proj.bits, attn.v_proj.bits} == {8}
    loading = sys.modules["edgespec.targets.load"]
    monkeypatch.setattr(loading, "match_widths", lambda mods: 0)
    own = load_target(out, dtype="auto")  # the file's widths: no fused form, the module path
    assert not own.model.native_blocks() and own.model.model.layers[0].self_attn.q_proj.bits == 4
    monkeypatch.undo()
    ids = list(range(5, 21))
    backend.set_q8_activations(False)
    try:
        got = np.array(target.score(ids, target.make_cache()).logits)
        ref = np.array(own.score(ids, own.make_cache()).logits)
    finally:
        backend.set_q8_activations(None)
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)
    prompt = "the cat sat on the mat and the cat sat on the"
    plain = Engine(target).generate(prompt, max_tokens=24)
    lookup = Engine(target, PromptLookupDrafter()).generate(prompt, max_tokens=24)
    assert lookup.token_ids == plain.token_ids and lookup.stats.proposed > 0


def test_nothing_is_re_packed_for_a_block_that_would_not_fuse(mod, tiny_models, tmp_path,
                                                               monkeypatch):  # noqa: F811
    """A block refused a fused form for another reason (``fused_block.refuses``: an o_proj
    bias, sinks, another activation) keeps its layers' widths: re-packing would only cost
    bytes."""
    import sys

    from edgespec.targets import load_target

    out = _v_wider(tiny_models.path(layers=2), tmp_path / "mixed")
    monkeypatch.setattr(sys.modules["edgespec.targets.load"], "refuses", lambda block: True)
    target = load_target(out, dtype="auto")
    assert target.model.widened == {}
    assert target.model.model.layers[0].self_attn.q_proj.bits == 4


def test_biased_q_k_v_of_mixed_widths_run_natively(mod, tiny_models, tmp_path):  # noqa: F811
    """qwen2's biased q/k/v (a Qwen2.5 Q4_K_M's widths): re-packed alike, the block fused with
    its biases, every block native, lookup equal to plain decoding."""
    from edgespec import Engine
    from edgespec.drafters.lookup import PromptLookupDrafter
    from edgespec.targets import load_target

    out = _v_wider(tiny_models.path(layers=2, bias=True), tmp_path / "mixed")
    target = load_target(out, dtype="auto")
    assert target.model.widened == {(4, 8): 4} and target.model.native_blocks()
    prompt = "the cat sat on the mat and the cat sat on the"
    plain = Engine(target).generate(prompt, max_tokens=24)
    lookup = Engine(target, PromptLookupDrafter()).generate(prompt, max_tokens=24)
    assert lookup.token_ids == plain.token_ids and lookup.stats.proposed > 0
