"""GGUF files of the ``qwen2`` and ``qwen3`` architectures: a tiny one of each (written under the
names ``gguf.TensorNameMap`` gives mlx-lm's parameters, k-quants and Q6_K among its tensors)
converted and run against mlx-lm's ``qwen2`` / ``qwen3`` on the ``gguf`` package's dequantization
of the same file; kept quantized it runs as the native block, and greedy lookup reproduces plain
decoding; the qwen2 pre-tokenizer splits digits one by one."""

from __future__ import annotations

import json

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGUFWriter, TensorNameMap, quants
from gguf import GGMLQuantizationType as T
from gguf.constants import MODEL_ARCH
from mlx.utils import tree_flatten

from edgespec.loading import gguf as eg
from edgespec.loading.tokenizer import Tokenizer
from edgespec.targets import load_target

from ._gguf_fixtures import TOKENS, _add_tokenizer
from .test_gguf_blocks import dequantized_weights, random_blocks

pytest.importorskip("mlx_lm")

_HIDDEN, _LAYERS, _HEADS, _KV, _FFN = 256, 2, 4, 2, 512
# qwen3's head_dim (its own field, from attention.key_length) is not hidden / heads here;
# mlx-lm's qwen2 derives it
_HEAD_DIM = {"qwen2": _HIDDEN // _HEADS, "qwen3": 128}
_CONFIG = {"hidden_size": _HIDDEN, "num_hidden_layers": _LAYERS, "intermediate_size": _FFN,
           "num_attention_heads": _HEADS, "num_key_value_heads": _KV, "rms_norm_eps": 1e-6,
           "rope_theta": 1_000_000.0, "vocab_size": len(TOKENS), "tie_word_embeddings": True,
           "max_position_embeddings": 512}
_TYPES = {"attn_q": T.Q4_K, "attn_k": T.Q4_K, "attn_v": T.Q6_K, "attn_output": T.Q4_K,
          "ffn_gate": T.Q4_K, "ffn_up": T.Q4_K, "ffn_down": T.Q6_K, "token_embd": T.Q8_0}
_ARCHS = {"qwen2": MODEL_ARCH.QWEN2, "qwen3": MODEL_ARCH.QWEN3}


def _mlx_lm_model(arch: str):
    import importlib

    module = importlib.import_module(f"mlx_lm.models.{arch}")
    config = {**_CONFIG, "model_type": arch, "head_dim": _HEAD_DIM[arch]}
    return module, module.Model(module.ModelArgs.from_dict(config))


def _write(path, arch: str) -> None:
    """mlx-lm's parameters of a tiny ``arch`` model, each under its GGUF name: norms and biases
    float32, the matrices random raw blocks (k-quants, Q6_K) or gguf-quantized (Q8_0)."""
    _, model = _mlx_lm_model(arch)
    tmap = TensorNameMap(_ARCHS[arch], _LAYERS)
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), arch)
    for key, value in [("block_count", _LAYERS), ("context_length", 512),
                       ("embedding_length", _HIDDEN), ("feed_forward_length", _FFN),
                       ("attention.head_count", _HEADS), ("attention.head_count_kv", _KV),
                       ("attention.key_length", _HEAD_DIM[arch]),
                       ("attention.value_length", _HEAD_DIM[arch]),
                       ("rope.dimension_count", _HEAD_DIM[arch])]:
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{arch}.rope.freq_base", 1_000_000.0)
    _add_tokenizer(w, "qwen2", add_bos=False)
    for hf, p in tree_flatten(model.parameters()):
        if hf.startswith("lm_head"):
            continue
        module, _, suffix = hf.rpartition(".")
        name = f"{tmap.get_name(module)}.{suffix}"
        kind = name.split(".")[-2]
        if len(p.shape) == 1:  # norms around 1, biases around 0
            base = 1.0 if suffix == "weight" else 0.0
            w.add_tensor(name, (base + rng.uniform(-0.4, 0.4, p.shape)).astype(np.float32))
        elif _TYPES[kind] == T.Q8_0:
            data = rng.normal(0, p.shape[1] ** -0.5, p.shape).astype(np.float32)
            w.add_tensor(name, quants.quantize(data, T.Q8_0), raw_dtype=T.Q8_0)
        else:
            blocks = random_blocks(_TYPES[kind], *p.shape, rng, scale=p.shape[1] ** -0.5 / 40)
            w.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=_TYPES[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _reference(path, arch: str):
    """mlx-lm's ``arch`` model on the ``gguf`` package's dequantization of the file."""
    _, model = _mlx_lm_model(arch)
    weights = dequantized_weights(path, model, TensorNameMap(_ARCHS[arch], _LAYERS))
    model.load_weights(list(weights.items()), strict=False)  # tied: no lm_head
    return model


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_a_qwen_gguf_matches_mlx_lm_and_runs_natively_kept_quantized(tmp_path, arch):
    from edgespec import Engine
    from edgespec.drafters.lookup import PromptLookupDrafter

    _write(tmp_path / "q.gguf", arch)
    out = eg.convert_gguf(tmp_path / "q.gguf", tmp_path / "out", progress=False)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == arch and config["head_dim"] == _HEAD_DIM[arch]
    assert config["attention_bias"] is (arch == "qwen2")
    stops = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    assert {TOKENS.index("<|im_end|>"), TOKENS.index("<|endoftext|>")} <= set(stops)
    ids = [int(i) for i in np.random.default_rng(1).integers(3, len(TOKENS), 24)]
    want = np.array(_reference(tmp_path / "q.gguf", arch)(mx.array(ids)[None])[0])
    exact = load_target(out, dtype="float32")
    ours = np.array(exact.score(ids, exact.make_cache()).logits)
    assert np.abs(ours - want).max() < 1e-4 * max(1.0, np.abs(want).max())

    kept = load_target(out, dtype="auto")  # k-quants as they are, Q6_K rounded to 8 bits
    assert kept.quantized and kept.model.rounded == {"Q6_K": sorted(
        f"model.layers.{i}.{m}" for i in range(_LAYERS) for m in ("self_attn.v_proj",
                                                                   "mlp.down_proj"))}
    # q and k re-packed to v's 8 bits (qwen2's with their biases), every block native
    assert kept.model.native_blocks() and kept.model.widened == {(4, 8): 2 * _LAYERS}
    prompt = ids[:8] * 3
    plain = Engine(kept).generate(prompt, max_tokens=24)
    lookup = Engine(kept, PromptLookupDrafter()).generate(prompt, max_tokens=24)
    assert lookup.token_ids == plain.token_ids and lookup.stats.proposed > 0


def test_the_qwen2_pre_tokenizer_splits_digits_one_by_one(tmp_path):
    _write(tmp_path / "q.gguf", "qwen3")
    out = eg.convert_gguf(tmp_path / "q.gguf", tmp_path / "out", progress=False)
    tok = Tokenizer.from_dir(out)
    pieces = json.loads((out / "tokenizer.json").read_text())["pre_tokenizer"]
    assert r"\p{N}{1,3}" not in json.dumps(pieces) and r"\p{N}" in json.dumps(pieces)
    assert tok.decode(tok.encode("12345", add_special_tokens=False)) == "12345"


@pytest.mark.parametrize("pre", ["deepseek-r1-qwen", "megrez", "kormo"])
def test_llama_cpps_other_names_of_the_qwen2_pre_tokenizer(tmp_path, pre):
    """llama.cpp reads these ``tokenizer.ggml.pre`` values as qwen2's splitting (the DeepSeek
    R1 distills of Qwen carry the first)."""
    from ._gguf_fixtures import write_tiny_gguf

    write_tiny_gguf(tmp_path / "q.gguf", pre=pre)
    write_tiny_gguf(tmp_path / "r.gguf", pre="qwen2")
    got = eg.convert_gguf(tmp_path / "q.gguf", tmp_path / "q", progress=False)
    want = eg.convert_gguf(tmp_path / "r.gguf", tmp_path / "r", progress=False)
    split = [json.loads((d / "tokenizer.json").read_text())["pre_tokenizer"] for d in (got, want)]
    assert split[0] == split[1]
