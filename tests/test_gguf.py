"""GGUF -> model directory: hyperparameters, tensor mapping, Q/K un-permutation, quantized values,
the rebuilt tokenizer, typed errors; and (marked ``demo``) the real SmolLM2 GGUF end to end."""

from __future__ import annotations

import json
import time
from pathlib import Path

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, quants

from ._gguf_fixtures import (FFN, HEADS, HIDDEN, KV_HEADS, LAYERS, TOKENS, permute,
                            write_tiny_gguf)
from edgespec.loading import gguf as eg
from edgespec.errors import ModelLoadError, TokenizerError, UnsupportedModelError
from edgespec.loading.tokenizer import StreamDecoder, Tokenizer


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(original HF-order weights, GGUF path, converted directory) for the default tiny model."""
    root = tmp_path_factory.mktemp("gguf")
    weights = write_tiny_gguf(root / "tiny.gguf")
    return weights, root / "tiny.gguf", eg.convert_gguf(root / "tiny.gguf", root / "out", progress=False)


def _dense(arrays: dict, module: str, bits: int | None = None) -> np.ndarray:
    if f"{module}.scales" not in arrays:
        return np.array(arrays[f"{module}.weight"].astype(mx.float32))
    w, s, b = (arrays[f"{module}.{k}"] for k in ("weight", "scales", "biases"))
    return np.array(mx.dequantize(w, s, b, group_size=32, bits=bits).astype(mx.float32))


def test_config_has_the_gguf_hyperparameters(converted):
    _, _, out = converted
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (HIDDEN, LAYERS, FFN)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (HEADS, KV_HEADS)
    assert config["head_dim"] == HIDDEN // HEADS
    assert config["rms_norm_eps"] == 1e-5 and config["rope_theta"] == 10000.0
    assert config["vocab_size"] == len(TOKENS) and config["max_position_embeddings"] == 256
    assert config["tie_word_embeddings"] is False
    # Q8_0 embedding among 4-bit layers: the per-module override (mlx-lm convention)
    assert config["quantization"] == {"group_size": 32, "bits": 4,
                                      "model.embed_tokens": {"group_size": 32, "bits": 8}}


def test_tensor_names_shapes_and_dtypes(converted):
    _, _, out = converted
    arrays = mx.load(str(out / "model.safetensors"))
    layer = "model.layers.1"
    assert arrays["model.embed_tokens.weight"].dtype == mx.uint32  # Q8_0 stays quantized
    assert arrays["model.embed_tokens.scales"].shape == (len(TOKENS), HIDDEN // 32)
    assert arrays[f"{layer}.self_attn.q_proj.weight"].dtype == mx.float32  # F32
    assert arrays[f"{layer}.self_attn.v_proj.weight"].dtype == mx.float16  # F16
    assert arrays[f"{layer}.mlp.up_proj.weight"].dtype == mx.bfloat16  # BF16, not MLX's float16
    assert arrays[f"{layer}.mlp.down_proj.weight"].shape == (HIDDEN, FFN * 4 // 32)  # 4-bit packed
    assert arrays["lm_head.weight"].shape == (len(TOKENS), HIDDEN)
    assert not [k for k in arrays if not k.startswith(("model.", "lm_head."))]


def test_qk_unpermutation_restores_hf_order(converted):
    weights, path, out = converted
    arrays = mx.load(str(out / "model.safetensors"))
    for i in range(LAYERS):
        q = np.array(arrays[f"model.layers.{i}.self_attn.q_proj.weight"])
        np.testing.assert_array_equal(q, weights[f"blk.{i}.attn_q.weight"])  # F32: exact
    # Q4_0 K: rows of weight, scales and biases moved together -> equals un-permuting gguf's own
    # dequantization of the stored (permuted) tensor
    stored = {t.name: t for t in GGUFReader(path).tensors}["blk.0.attn_k.weight"]
    reference = quants.dequantize(stored.data, T.Q4_0)
    k = _dense(arrays, "model.layers.0.self_attn.k_proj", bits=4)
    np.testing.assert_allclose(k, np.array(eg.unpermute_rows(mx.array(reference), KV_HEADS)), atol=1e-3)
    assert np.abs(k - weights["blk.0.attn_k.weight"]).max() < 0.25  # and close to the original


def test_unpermute_inverts_permute():
    w = mx.arange(8 * 6 * 3).reshape(48, 3)
    for heads in (1, 2, 3, 6):
        np.testing.assert_array_equal(np.array(eg.unpermute_rows(eg.permute_rows(w, heads), heads)), np.array(w))
        np.testing.assert_array_equal(np.array(eg.permute_rows(w, heads)), permute(np.array(w), heads))


@pytest.mark.parametrize("module, bits, tol", [
    ("model.embed_tokens", 8, 0.02), ("model.layers.0.self_attn.o_proj", 4, 0.25),
    ("model.layers.0.mlp.down_proj", 4, 0.3), ("model.layers.0.mlp.up_proj", None, 0.01),
    ("model.layers.0.self_attn.v_proj", None, 1e-3), ("lm_head", None, 1e-3)])
def test_dequantized_values_close_to_originals(converted, module, bits, tol):
    weights, _, out = converted
    gguf_name = {v: k for k, v in eg.tensors._GLOBAL_NAMES.items()}.get(module)
    if gguf_name is None:
        kind = {v: k for k, v in eg.tensors._LAYER_NAMES.items()}[module.split(".", 3)[-1]]
        gguf_name = f"blk.0.{kind}"
    got = _dense(mx.load(str(out / "model.safetensors")), module, bits)
    assert np.abs(got - weights[f"{gguf_name}.weight"]).max() < tol


def test_rebuilt_tokenizer_round_trips(converted):
    _, _, out = converted
    tok = Tokenizer.from_dir(out)
    assert tok.vocab_size == len(TOKENS) and tok.vocab()["<|im_end|>"] == 2
    for text in ["Hello world", "the 2024 café 😀!", "naïve – ünïcödé 日本", "<|im_start|>hi<|im_end|>"]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("Hello world") == [TOKENS.index("Hello"), TOKENS.index("Ġworld")]
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("2024") == [TOKENS.index(c) for c in "2024"]  # smollm: digits split, no "20"
    assert tok.eos_token_ids == frozenset({2}) and tok.bos_token_id == 1
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        "<|im_start|><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2}


def test_add_bos_token_and_tied_embeddings(tmp_path):
    write_tiny_gguf(tmp_path / "t.gguf", tied=True, add_bos=True, pre="gpt-2")
    out = eg.convert_gguf(tmp_path / "t.gguf", tmp_path / "out", progress=False)
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is True
    assert "lm_head.weight" not in mx.load(str(out / "model.safetensors"))
    tok = Tokenizer.from_dir(out)
    assert tok.encode("Hello")[0] == 1 and tok.encode("Hello", add_special_tokens=False)[0] != 1
    assert tok.encode("2024", add_special_tokens=False)[0] == TOKENS.index("20")  # gpt-2: no digit split


def test_sentencepiece_vocabulary(tmp_path):
    """tokenizer.ggml.model == "llama": BPE from scores, byte fallback, space prefix, BOS."""
    singles = ["▁", "H", "e", "l", "o", "w", "r", "d"]
    merged = {"▁H": -1, "ll": -2, "llo": -3, "ello": -2.5, "▁Hello": -0.5, "▁w": -4, "or": -3.5,
              "▁wor": -5, "ld": -4.5, "▁world": -0.6}
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + singles + list(merged)
    scores = [0.0] * 259 + [-10.0 - i for i in range(len(singles))] + list(merged.values())
    types = [2, 3, 3] + [6] * 256 + [1] * (len(singles) + len(merged))
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": pieces,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}
    (tmp_path / "tok").mkdir()
    for name, content in eg.tokenizer_files(meta, tmp_path / "spm.gguf").items():
        (tmp_path / "tok" / name).write_text(content if isinstance(content, str) else json.dumps(content))
    tok = Tokenizer.from_dir(tmp_path / "tok")
    ids = tok.encode("Hello world")
    assert ids == [1, pieces.index("▁Hello"), pieces.index("▁world")]
    assert tok.decode(ids, skip_special_tokens=True) == "Hello world"
    emoji = tok.encode("H😀", add_special_tokens=False)  # byte fallback: 4 byte tokens
    assert emoji[1:] == [3 + b for b in "😀".encode()] and tok.decode(emoji) == "H😀"


def test_a_gemma_file_without_a_template_gets_gemmas_turns(tmp_path):
    """A gemma-family GGUF with no chat template (the Gemma 3 270M file has none) renders chats
    in Gemma's turn format and stops at <end_of_turn>; other families keep the generic one."""
    pieces = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"] + [
        f"<0x{b:02X}>" for b in range(256)] + ["▁", "h", "i"]
    meta = {"general.architecture": "gemma3", "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": pieces, "tokenizer.ggml.scores": [0.0] * len(pieces),
            "tokenizer.ggml.token_type": [3] * 5 + [6] * 256 + [1] * 3,
            "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1}
    for arch, template in (("gemma3", True), ("llama", False)):
        files = eg.tokenizer_files(dict(meta, **{"general.architecture": arch}),
                                   tmp_path / "g.gguf")
        assert ("chat_template" in files["tokenizer_config.json"]) == template, arch
        stops = files["generation_config.json"]["eos_token_id"]
        assert stops == ([1, 4] if template else 1), arch
    own = eg.tokenizer_files(dict(meta, **{"tokenizer.chat_template": "{{ 'x' }}"}),
                             tmp_path / "g.gguf")  # its own template, no end-of-turn id
    assert own["tokenizer_config.json"]["chat_template"] == "{{ 'x' }}"
    assert own["generation_config.json"]["eos_token_id"] == [1, 4]
    (tmp_path / "tok").mkdir()
    for name, content in eg.tokenizer_files(meta, tmp_path / "g.gguf").items():
        text = content if isinstance(content, str) else json.dumps(content)
        (tmp_path / "tok" / name).write_text(text)
    tok = Tokenizer.from_dir(tmp_path / "tok")
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " hi "},
            {"role": "assistant", "content": "hi"}, {"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(chat) == (
        "<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n"
        "<start_of_turn>model\nhi<end_of_turn>\n"
        "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n")
    assert tok.eos_token_ids == frozenset({1, 4})


# -- errors --------------------------------------------------------------------------------------

def test_unknown_architecture(tmp_path):
    write_tiny_gguf(tmp_path / "f.gguf", arch="falcon")
    with pytest.raises(UnsupportedModelError, match=r"f\.gguf.*'falcon'.*supported: llama"):
        eg.convert_gguf(tmp_path / "f.gguf", tmp_path / "out", progress=False)


@pytest.mark.parametrize("qtype", [T.IQ4_NL, T.MXFP4])
def test_unsupported_tensor_type(tmp_path, qtype):
    write_tiny_gguf(tmp_path / "x.gguf", types={"ffn_up": qtype})
    with pytest.raises(UnsupportedModelError,
                       match=rf"blk\.0\.ffn_up\.weight.*{qtype.name}.*Q4_0, Q4_1, Q8_0, Q5_0.*Q4_K.*Q6_K"):
        eg.convert_gguf(tmp_path / "x.gguf", tmp_path / "out", progress=False)


def test_unknown_tensor_name(tmp_path):
    write_tiny_gguf(tmp_path / "x.gguf", extra_tensors={"rope_freqs.weight": np.ones(8, np.float32)})
    with pytest.raises(UnsupportedModelError, match="'rope_freqs.weight'"):
        eg.convert_gguf(tmp_path / "x.gguf", tmp_path / "out", progress=False)


@pytest.mark.parametrize("keep", [0.5, 0.02])
def test_truncated_file(tmp_path, keep):
    write_tiny_gguf(tmp_path / "t.gguf")
    data = (tmp_path / "t.gguf").read_bytes()
    (tmp_path / "t.gguf").write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError, match=r"t\.gguf"):
        eg.convert_gguf(tmp_path / "t.gguf", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "junk.gguf").write_text("hello, I am not a model")
    with pytest.raises(ModelLoadError, match=r"junk\.gguf"):
        eg.convert_gguf(tmp_path / "junk.gguf", tmp_path / "out", progress=False)


def test_missing_tokenizer_metadata(tmp_path):
    write_tiny_gguf(tmp_path / "nt.gguf", tokenizer=False)
    with pytest.raises(TokenizerError, match=r"nt\.gguf.*tokenizer\.ggml\.model.*gpt2, llama"):
        eg.convert_gguf(tmp_path / "nt.gguf", tmp_path / "out", progress=False)


def test_unsupported_pre_tokenizer(tmp_path):
    write_tiny_gguf(tmp_path / "p.gguf", pre="chameleon")
    with pytest.raises(TokenizerError, match=r"'chameleon'.*supported: gpt-2, smollm"):
        eg.convert_gguf(tmp_path / "p.gguf", tmp_path / "out", progress=False)


def test_existing_output_is_not_overwritten(tmp_path, converted):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("keep me")
    with pytest.raises(ModelLoadError, match="already exists"):
        eg.convert_gguf(converted[1], tmp_path / "out", progress=False)
    assert (tmp_path / "out" / "precious.txt").read_text() == "keep me"


def test_weights_are_written_in_shards_as_they_are_decoded(tmp_path, converted, monkeypatch):
    """With a shard size below the model's, the conversion writes several weights files as it
    goes (``SHARD_BYTES``: it never holds every tensor), named as Hugging Face names them, and
    the model loads to the same arrays as from one file."""
    monkeypatch.setattr(eg.convert, "SHARD_BYTES", 40_000)
    out = eg.convert_gguf(converted[1], tmp_path / "out", progress=False)
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    sharded = {k: v for f in files for k, v in mx.load(str(out / f)).items()}
    whole = mx.load(str(converted[2] / "model.safetensors"))
    assert sharded.keys() == whole.keys()
    assert all(mx.array_equal(sharded[k], whole[k]).item() for k in whole)
    assert not list(tmp_path.glob(".*partial"))
    from edgespec.targets import load_target

    a, b = load_target(out, dtype="auto"), load_target(converted[2], dtype="auto")
    ids = [5, 9, 12, 30, 7]
    assert mx.array_equal(a.score(ids, a.make_cache()).logits,
                          b.score(ids, b.make_cache()).logits).item()


def test_interrupted_conversion_leaves_nothing(tmp_path, converted, monkeypatch):
    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(eg.convert.mx, "save_safetensors", fail)
    with pytest.raises(KeyboardInterrupt):
        eg.convert_gguf(converted[1], tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []  # no out/, no .partial directory


# -- the real demo model -------------------------------------------------------------------------

def _dense_model(path: Path):
    """mlx-lm's llama on the converted directory, every weight dequantized to float32."""
    from mlx_lm.models import llama

    config = json.loads((path / "config.json").read_text())
    quant = config.pop("quantization")
    arrays = mx.load(str(path / "model.safetensors"))
    weights = {}
    for name, w in arrays.items():
        module, _, suffix = name.rpartition(".")
        if suffix in ("scales", "biases"):
            continue
        bits = quant.get(module, quant)["bits"] if f"{module}.scales" in arrays else None
        weights[name] = _dense(arrays, module, bits) if bits else np.array(w.astype(mx.float32))
    model = llama.Model(llama.ModelArgs.from_dict(config))
    model.load_weights([(k, mx.array(v)) for k, v in weights.items()])
    return model


def _greedy(model, ids: list[int], eos: frozenset[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        nxt = int(mx.argmax(model(mx.array([ids + out]))[0, -1]).item())
        if nxt in eos:
            break
        out.append(nxt)
    return out


@pytest.mark.demo
def test_demo_model_end_to_end(tmp_path, monkeypatch):
    from edgespec.loading.hub import resolve_model

    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path))
    path = resolve_model("demo", progress=False)  # converts
    start = time.perf_counter()
    assert resolve_model("demo", progress=False) == path
    assert time.perf_counter() - start < 0.5  # the second call reuses the conversion
    config = json.loads((path / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["tie_word_embeddings"] is True and config["rope_theta"] == 100000.0

    tok = Tokenizer.from_dir(path)
    assert tok.vocab_size == 49152 and tok.eos_token_ids == frozenset({2})
    assert tok.encode("<|im_start|>") == [1] and tok.encode("<|im_end|>") == [2]
    # Regression ids; consistent with the HF vocabulary layout (17 specials, then bytes: "!" = 17)
    assert tok.encode("Hello, world!") == [19556, 28, 905, 17]
    assert tok.encode("Hello") == [19556] and tok.encode("2024") == [34, 32, 34, 36]
    for text in ["Hello, world!", " leading  spaces\n\ttabs", "Ünïcödé – 日本語 😀🎉", "x = 3.14 * 2"]:
        assert tok.decode(tok.encode(text)) == text
        stream = StreamDecoder(tok)
        assert "".join(stream.add(i) for i in tok.encode(text)) + stream.flush() == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")

    # mlx-lm's own llama on the converted weights (dequantized to float32: MLX's CPU quantized
    # matmul is much slower than float32 with OpenBLAS): a right answer proves the Q/K order.
    ids = tok.encode(prompt, add_special_tokens=False)
    model = _dense_model(path)
    answer = tok.decode(_greedy(model, ids, tok.eos_token_ids, 12))
    assert "Paris" in answer, answer

    # The quantized directory as mlx-lm loads it (config["quantization"] with the 8-bit embedding
    # override) computes the same function.
    from mlx_lm.utils import load_model

    quantized, _ = load_model(path)
    short = mx.array([ids[-6:]])
    np.testing.assert_allclose(np.array(quantized(short)[0, -1].astype(mx.float32)),
                               np.array(model(short)[0, -1]), atol=0.25, rtol=0.02)
