"""The whole decoder block as one native operation (kernels/native/block.cpp, used by
``FusedBlock`` for float blocks on the CPU, batch 1, <= 32 tokens under a TreeMask) against its
pure-MLX twin (the fused path with the native block off): logits and the cache's keys/values
after chains and trees, with and without biases, with qwen3's per-head q/k norms, through a
sliding window whose compacted cache is a strided view; greedy output of every drafter stays plain decoding's (the engine
tests); bad inputs name what is allowed."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec.kernels import native
from edgespec.targets import load_target
from edgespec.targets.decoder import Decoder
from edgespec.tree import DraftTree

from .test_kernels import mod  # noqa: F401  (the fixture: the module, or skip / fail)
from .tiny import KINDS, QK_NORM


def _run(target, on: bool, context: int):
    """Logits of a chain and a tree after ``context`` tokens, and the cache after committing."""
    blocks = [b._fused for b in target.model.model.layers]
    saved = [f.native_args for f in blocks]
    if not on:
        for f in blocks:
            f.native_args = None
    try:
        cache = target.make_cache()
        ids = [(5 * i + 3) % 200 + 4 for i in range(context + 12)]
        for a in range(0, context, 64):  # prefill chunks: > 32 tokens, the fused path
            target.score(ids[a : min(a + 64, context)], cache, head=False)
            cache.commit()
        outs = [target.score(ids[context : context + 5], cache).logits]
        cache.commit()
        tree = DraftTree([ids[context + 5], 9, 10, 11, 12, 13], [-1, 0, 0, 1, 1, 3])
        outs.append(target.score(tree, cache).logits)
        cache.commit([0, 1, 3])
        outs.append(target.score([7], cache).logits)
        cache.commit()
        n = cache.offset - cache.start
        kv = [np.array(a[..., : cache.slots(i), :]) for i, a in enumerate(cache.keys)]
        return [np.array(o) for o in outs], kv, n
    finally:
        for f, a in zip(blocks, saved):
            f.native_args = a


@pytest.mark.parametrize("kind,context", [("llama", 20), ("bias", 20), ("window", 20),
                                          ("window", 340), ("qk_norm", 20)])
def test_native_block_matches_the_fused_path(mod, tiny_models, kind, context, monkeypatch):
    monkeypatch.setattr(Decoder, "_stack_for", lambda *a: None)  # one call per layer (the
    # stack of them in one call: tests/test_native_stack.py)
    options = QK_NORM if kind == "qk_norm" else KINDS[kind]
    target = load_target(tiny_models.path(layers=3, **options), dtype="float32")
    assert all(b._fused.native_args is not None for b in target.model.model.layers)
    calls = []
    real = mod.decoder_block

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    mod.decoder_block = counted
    try:
        got, got_kv, n1 = _run(target, True, context)
    finally:
        mod.decoder_block = real
    want, want_kv, n2 = _run(target, False, context)
    assert calls and n1 == n2
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)
    for g, w in zip(got_kv, want_kv):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)


# q/k norms with int8 x: not against the twin, whose x after a few layers differs from the
# native block's by float rounding, which can move a value across an int8 rounding boundary
# that the norms then carry (the stack and batch tests check those bits against the per-layer
# native path instead)
@pytest.mark.parametrize("q8,options", [(False, {}), (True, {}), (False, QK_NORM),
                                        (False, KINDS["bias"]), (True, KINDS["bias"])],
                         ids=["llama", "llama-q8", "qk_norm", "bias", "bias-q8"])
def test_native_block_matches_the_fused_path_quantized(mod, tiny_models, tmp_path, q8, options,
                                                      monkeypatch):
    from edgespec.kernels import backend

    from .test_qmatmul import _quantized_copy

    if q8 and not backend.use_q8_activations(4) and not mod.has_q8_activations():
        pytest.skip("no AVX-512 VNNI here")
    monkeypatch.setattr(Decoder, "_stack_for", lambda *a: None)  # one call per layer
    target = load_target(_quantized_copy(tiny_models.path(layers=3, **options), tmp_path / "q"),
                         dtype="auto")
    assert target.quantized
    assert all(b._fused.native_args is not None for b in target.model.model.layers)
    calls = []
    real = mod.decoder_block
    monkeypatch.setattr(mod, "decoder_block", lambda arrays, *a, **kw: calls.append(a[11]) or real(
        arrays, *a, **kw))
    backend.set_q8_activations(q8)
    try:
        got, got_kv, _ = _run(target, True, 20)
        assert calls and all(len(quant) == 4 for quant in calls)  # the quantized layout
        # the twin: the fused path, whose forward would keep x in float32 (backend.q8_scope),
        # told its rows are exact so that it rounds x to int8 as the native block does
        monkeypatch.setattr(target.model, "native_blocks", lambda: True)
        want, want_kv, _ = _run(target, False, 20)
    finally:
        backend.set_q8_activations(None)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)
    for g, w in zip(got_kv, want_kv):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)


def _rows_alone_and_together(target, n: int) -> None:
    ids = [(3 * i + 1) % 200 + 4 for i in range(20 + n)]
    whole_cache, one_cache = target.make_cache(), target.make_cache()
    for c in (whole_cache, one_cache):
        target.score(ids[:20], c)
        c.commit()
    # hidden states: the LM head may take the BLAS for one row and the kernel for eight
    whole = target.score(ids[20 : 20 + n], whole_cache, head=False).hidden
    for i in range(n):
        row = target.score(ids[20 + i : 21 + i], one_cache, head=False).hidden
        one_cache.commit()
        assert mx.array_equal(row[0], whole[i]).item(), i


@pytest.mark.parametrize("options", [{}, QK_NORM], ids=["llama", "qk_norm"])
def test_a_row_does_not_depend_on_the_rows_with_it(mod, tiny_models, options):
    _rows_alone_and_together(load_target(tiny_models.path(layers=2, **options), dtype="float32"),
                             8)


def test_a_quantized_row_does_not_depend_on_the_rows_with_it(mod, tiny_models, tmp_path):
    """12 rows: the quantized products dequantize a chunk for the float kernel (from 9 rows;
    33 with the buffer), one row takes the one-row blocks: the same bits, buffered or not."""
    from .test_qmatmul import _quantized_copy

    target = load_target(_quantized_copy(tiny_models.path(layers=2), tmp_path / "q"), dtype="auto")
    assert target.model.native_blocks()
    before = mod.buffered_dequantization()
    try:
        for on in (False, True):
            mod.set_buffered_dequantization(on)
            _rows_alone_and_together(target, 12)
    finally:
        mod.set_buffered_dequantization(before)


def test_a_held_cache_array_keeps_its_rows(mod, tiny_models):
    """The block's new keys/values reach the cache by MLX's slice update, which writes them in
    place only while the cache holds its buffer alone (in a decode loop of the demo model it
    did for all 1,200 layer buffers of 20 steps); an array someone still holds must keep its
    rows, and the cache must get the same rows either way."""
    target = load_target(tiny_models.path(layers=2), dtype="float32")
    ids = [(3 * i + 1) % 200 + 4 for i in range(40)]
    caches = []
    for hold in (False, True):
        cache = target.make_cache()
        target.score(ids[:20], cache)
        cache.commit()
        mx.eval(cache.state())
        held = cache.keys[0] if hold else None
        before = np.array(cache.keys[0])
        for i in range(3):
            mx.eval(target.score(ids[20 + i : 21 + i], cache).logits, cache.state())
            cache.commit()
        if hold:
            np.testing.assert_array_equal(np.array(held), before)
        caches.append([np.array(a[:, :, : cache.slots(i)]) for i, a in enumerate(cache.keys)])
    for a, b in zip(*caches):
        np.testing.assert_array_equal(a, b)


def _small_block(width: int = 8):
    """A float block's inputs for 2 tokens (hidden 8, x and q|k|v ``width`` wide: 16 for the
    dual form), weights after the biases, and its keyword arguments but ``slots``."""
    keys = mx.zeros((1, 1, 16, 4))
    anc, qpos = mx.zeros((2, 2), dtype=mx.uint32), mx.zeros((2,), dtype=mx.int32)
    arrays = [mx.zeros((2, width)), keys, keys, anc, qpos, mx.zeros((2,)), mx.ones((width,)),
              mx.ones((8,)), mx.zeros((0,)), mx.zeros((0,)), mx.zeros((0,)),
              mx.zeros((16, width)), mx.zeros((8, 8)), mx.zeros((32, 8)), mx.zeros((8, 16))]
    args = dict(hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, rope_dims=4,
                traditional=False, mscale=1.0, rope_scale=1.0, eps=1e-5, attn_scale=0.5,
                quant=[], q8=False, key_start=0, window=0)
    return arrays, args


def test_bad_inputs_name_what_is_allowed(mod):  # the float layout: weights after the biases
    arrays, args = _small_block()
    keys = arrays[1]
    out, k, v = mod.decoder_block(arrays, slots=3, **args)
    assert out.shape == (2, 8) and k.shape == keys.shape
    with pytest.raises(ValueError, match="no room for the new rows"):
        mod.decoder_block(arrays, slots=15, **args)
    with pytest.raises(ValueError, match=r"wqkv \(\(heads \+ 2 kv_heads\) head_dim, hidden\)"):
        mod.decoder_block(arrays[:11] + [mx.zeros((12, 8))] + arrays[12:], slots=3, **args)
    with pytest.raises(ValueError, match="1 float array, or 3 when quantized"):
        mod.decoder_block(arrays, slots=3, **{**args, "quant": [[32, 4]] * 4})
    with pytest.raises(ValueError, match="needs x, keys, values"):
        mod.decoder_block(arrays[:5], slots=3, **args)
    with pytest.raises(ValueError, match=r"head_dim 1\.\.256"):
        mod.decoder_block(arrays, slots=3, **{**args, "head_dim": 300})
    # two arrays after the weights are the q/k norm weights: (head_dim,) each
    with pytest.raises(ValueError, match=r"q/k norm weights must be float32 \(head_dim,\)"):
        mod.decoder_block(arrays + [mx.ones((3,)), mx.ones((3,))], slots=3, **args)
    assert native.load() is mod


def test_strided_inputs_read_the_same(mod):
    """The block reads the cache through its strides; a view whose head_dim axis is not
    contiguous (no KVCache makes one) is copied for attention, and so is a small input (x, a
    norm weight) that is not row-contiguous: the results are the same."""
    mx.random.seed(3)
    H, D, I, slots = 8, 4, 16, 5
    keys, values = mx.random.normal((1, 1, 16, D)), mx.random.normal((1, 1, 16, D))
    strided_k = mx.swapaxes(mx.contiguous(mx.swapaxes(keys, 2, 3)), 2, 3)  # last stride 16
    strided_v = mx.swapaxes(mx.contiguous(mx.swapaxes(values, 2, 3)), 2, 3)
    mx.eval(keys, values, strided_k, strided_v)
    assert strided_k.shape == keys.shape
    rest = [mx.array([[0b11, 0], [0b10, 0]], dtype=mx.uint32), mx.array([5, 6], dtype=mx.int32),
            mx.array([1.0, 0.01]), mx.ones((H,)), mx.ones((H,)), mx.zeros((0,)), mx.zeros((0,)),
            mx.zeros((0,))] + [mx.random.normal(s) * 0.3 for s in ((16, H), (H, H), (2 * I, H),
                                                                  (H, I))]
    args = dict(hidden=H, heads=2, kv_heads=1, head_dim=D, intermediate=I, rope_dims=D,
                traditional=False, mscale=1.0, rope_scale=1.0, eps=1e-5, attn_scale=0.5,
                quant=[], q8=False, slots=slots, key_start=0, window=0)
    x = mx.random.normal((2, H))
    want = mod.decoder_block([x, keys, values, *rest], **args)
    got = mod.decoder_block([x, strided_k, strided_v, *rest], **args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=1e-6, atol=1e-6)
    # x and the norm weights as strided views too (copied when evaluated), x also as (1, N, H)
    strided_x = mx.swapaxes(mx.contiguous(mx.swapaxes(x, 0, 1)), 0, 1)
    n1 = mx.ones((2 * H,))[::2]
    got = mod.decoder_block([strided_x[None], keys, values, *rest[:3], n1, *rest[4:]], **args)
    assert got[0].shape == (1, 2, H)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.array(g).reshape(np.array(w).shape), np.array(w),
                                   rtol=1e-6, atol=1e-6)


# -- the EAGLE-3 head's layer (``dual``): heads/eagle3.py's NativeLayer against its ops twin


def _head_forward(head, on: bool):
    """The head's logits and outputs for a drafted tree over a committed chain of 20 pairs,
    with the native layer (on) or its twin (``_native_layer`` answering None), and the cache's
    keys after committing the tree's rows."""
    from edgespec.kernels.tree_mask import TreeMask, ancestor_bits, tree_mask

    H = head.config.hidden_size
    rng = np.random.default_rng(1)
    emb, h = (mx.array(rng.standard_normal((26, H)).astype(np.float32)) for _ in range(2))
    real = head._native_layer
    if not on:
        head._native_layer = lambda *a: None
    try:
        cache = head.make_cache()
        head.step(emb[:14], h[:14], 0, tree_mask(None, 14, 0, 0, None), cache)  # a chain
        cache.commit()
        head.step(emb[14:20], h[14:20], 14, tree_mask(None, 6, 0, 14, None), cache)
        cache.commit()
        anc = np.eye(6, dtype=bool)
        anc[2, 0] = anc[3, 1] = anc[4, 2] = anc[4, 0] = anc[5, 0] = True
        qpos = (20 + np.array([0, 0, 1, 1, 2, 1])).astype(np.int32)
        mask = TreeMask(ancestor_bits(anc), qpos, 0, 20, None)
        logits, out = head.step(emb[20:], h[20:], None, mask, cache, last=3)
        cache.commit()
        keys = np.array(cache.keys[0][:, :, : cache.offset])
        return np.array(logits), np.array(out), keys
    finally:
        head._native_layer = real


@pytest.mark.parametrize("bits", [0, 8, 4])
@pytest.mark.usefixtures("float_activations")
def test_native_head_layer_matches_its_twin(mod, bits, monkeypatch):
    from edgespec.heads import Eagle3Head, HeadConfig
    from edgespec.heads.eagle3 import quantized_head

    config = HeadConfig(kind="eagle3", hidden_size=64, vocab_size=300, draft_vocab_size=96,
                        aux_layers=(0, 1, 2), num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, intermediate_size=128, rms_norm_eps=1e-5,
                        rope_theta=10000.0, target_layers=6)
    mx.random.seed(3)
    head = Eagle3Head(config)
    mx.eval(head.parameters())
    if bits:
        head = quantized_head(head, bits)
    calls = []
    real = mod.decoder_block
    monkeypatch.setattr(mod, "decoder_block",
                        lambda *a, **kw: calls.append(kw.get("dual")) or real(*a, **kw))
    got = _head_forward(head, True)
    assert calls == [True] * 3  # every forward of the head went through the one native op
    want = _head_forward(head, False)
    assert calls == [True] * 3
    assert got[0].shape == (3, 96) and got[1].shape == (6, 64)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=2e-5)


def test_dual_block_names_its_shapes(mod):
    arrays, args = _small_block(width=16)
    args = dict(args, slots=3, dual=True)
    with pytest.raises(ValueError, match=r"\(N, 2 hidden\)"):
        mod.decoder_block([mx.zeros((2, 8))] + arrays[1:], **args)  # dual wants (N, 2 hidden)
    out, k, _ = mod.decoder_block(arrays, **args)
    assert out.shape == (2, 8) and k.shape == arrays[1].shape
    with pytest.raises(ValueError, match=r"n1 \(2 hidden,\)"):
        mod.decoder_block(arrays[:6] + [mx.ones((8,))] + arrays[7:], **args)


@pytest.mark.parametrize("bits", [None, 4, 8])
@pytest.mark.parametrize("config,context", [("gemma3-untied-scaled", 20),
                                            ("gemma3-untied-scaled", 340), ("gemma2", 20)])
def test_gemmas_sandwich_block_matches_its_module_path(mod, tmp_path, bits, config, context,
                                                       monkeypatch):
    """Gemma 3's block (norms after attention and the MLP, (1 + w) norms, tanh-GELU, sliding
    windows with their own RoPE base; at 340 tokens the sliding layers' caches compact) and
    Gemma 2's (attention scores soft-capped) as the native sandwich block against their module
    path, float32 and kept 4- and 8-bit (float x on both sides: with int8 x the twin's
    last-bit differences cross rounding boundaries, as for qwen3's q/k norms above)."""
    from edgespec.kernels import backend

    from .oracle import CONFIGS, make_oracle_model, quantize_oracle_model

    monkeypatch.setattr(Decoder, "_stack_for", lambda *a: None)  # one call per layer
    path = make_oracle_model(tmp_path / "g", CONFIGS[config], 0)
    if bits:
        quantize_oracle_model(path, bits)
    target = load_target(path, dtype="auto" if bits else "float32")
    blocks = target.model.model.layers
    assert all(b.sandwich and b.native_ready() for b in blocks) and target.quantized == bool(bits)
    assert target.model.native_blocks()
    calls = []
    real = mod.decoder_block
    monkeypatch.setattr(mod, "decoder_block", lambda arrays, *a, **kw: calls.append(
        kw["sandwich"] and kw["softcap"] == (2.0 if config == "gemma2" else 0.0))
        or real(arrays, *a, **kw))
    backend.set_q8_activations(False)
    try:
        got, got_kv, n1 = _run(target, True, context)
        want, want_kv, n2 = _run(target, False, context)
    finally:
        backend.set_q8_activations(None)
    assert calls and all(calls) and n1 == n2
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-4 * max(1.0, np.abs(w).max() / 10), rtol=1e-4)
    for g, w in zip(got_kv, want_kv):  # Gemma's scaled embedding: larger values than llama's
        np.testing.assert_allclose(g, w, atol=5e-5, rtol=5e-5)


def test_a_gemma3_row_does_not_depend_on_the_rows_with_it(mod, tmp_path):
    """Rows alone and together, kept 4-bit with int8 x (the decoding default), through the
    stack of sandwich blocks."""
    from .oracle import CONFIGS, make_oracle_model, quantize_oracle_model

    path = make_oracle_model(tmp_path / "g", CONFIGS["gemma3-untied-scaled"], 0)
    quantize_oracle_model(path, 4)
    target = load_target(path, dtype="auto")
    assert target.model.native_blocks() and target.model._current_stack() is not None
    _rows_alone_and_together(target, 12)


@pytest.mark.parametrize("quantized", [False, True])
def test_a_head_layer_with_biases_keeps_its_module_path(quantized):
    """The native head layer leaves its bias slots empty, so a layer whose projections have
    biases (none of edgespec's heads, but a quantized one would pass ``quant_key``) has no
    native form, float or quantized."""
    import mlx.nn as nn

    from edgespec.heads import HeadConfig
    from edgespec.heads.eagle3 import Eagle3Layer, NativeLayer

    config = HeadConfig(kind="eagle3", hidden_size=64, vocab_size=300, draft_vocab_size=300,
                        aux_layers=(0, 1, 2), num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, intermediate_size=128)
    layer = Eagle3Layer(config)
    for name in ("q_proj", "k_proj", "v_proj"):
        old = layer.self_attn[name]
        setattr(layer.self_attn, name, nn.Linear(old.weight.shape[1], old.weight.shape[0],
                                                 bias=True))
    if quantized:
        nn.quantize(layer, group_size=32, bits=4,
                    class_predicate=lambda _, m: isinstance(m, nn.Linear))
    assert NativeLayer(layer).args is None
