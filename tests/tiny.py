"""Tiny random llama-family model directories for tests (HF layout, real tokenizer files).

The tokenizer is byte-level BPE over the 256 byte symbols plus a handful of merges and three
special tokens, so text round-trips exactly and chat templates work like a real model's.
"""

from __future__ import annotations

import json
from pathlib import Path

import edgespec  # noqa: F401  (first: it loads the optimized BLAS, which must precede mlx)
import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

KINDS = {"llama": {}, "window": {"window": 8}, "bias": {"bias": True}}
"""The model families' variants every path is tested on: plain llama, mistral's sliding window,
qwen2's attention bias (options of ``make_tiny_model``). ``QK_NORM`` (qwen3's per-head q/k
norms) is a fourth, taken by the native block's and stack's tests."""
QK_NORM = {"qk_norm": True}

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)


def _byte_level_tokenizer(extra_tokens=()) -> Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    for t in extra_tokens:
        vocab[t] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok


def write_tokenizer(out: Path, extra_tokens: tuple = ()) -> int:
    """Write the byte-level tokenizer and a ChatML tokenizer_config to ``out``; returns the
    vocabulary size."""
    tok = _byte_level_tokenizer(extra_tokens)
    tok.save(str(Path(out) / "tokenizer.json"))
    (Path(out) / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": None, "eos_token": "<|im_end|>", "add_bos_token": False,
        "chat_template": CHATML,
    }))
    return tok.get_vocab_size()


def make_tiny_model(out: Path, *, layers: int = 2, hidden: int = 64, heads: int = 4,
                    kv_heads: int = 2, intermediate: int = 128, window: int | None = None,
                    bias: bool = False, tie: bool = True, seed: int = 0, scale: float = 1.0,
                    context: int = 2048, extra_tokens: tuple = (), qk_norm: bool = False) -> Path:
    """Write a random model directory to ``out`` and return it (``qk_norm``: a qwen3, whose
    q and k are normalised per head, with random norm weights)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(out, extra_tokens)
    config = {
        "model_type": "qwen3" if qk_norm else "qwen2" if bias else ("mistral" if window else "llama"),
        "hidden_size": hidden, "num_hidden_layers": layers, "intermediate_size": intermediate,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "vocab_size": vocab,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": tie,
        "max_position_embeddings": context, "attention_bias": bias,
    }
    if qk_norm:
        config["head_dim"] = hidden // heads
    if window:
        config["sliding_window"] = window
        if bias:
            config["use_sliding_window"] = True
    (out / "config.json").write_text(json.dumps(config, indent=1))
    mx.save_safetensors(str(out / "model.safetensors"),
                        _random_weights(config, np.random.default_rng(seed), scale))
    return out


def _random_weights(c: dict, rng: np.random.Generator, scale: float) -> dict[str, mx.array]:
    h, n, kv, inter = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
    d = h // n

    def w(*shape):
        return mx.array(rng.normal(0, scale / np.sqrt(shape[-1]), shape).astype(np.float32))

    embed = w(c["vocab_size"], h) * 8
    embed[: len(SPECIALS)] = 0  # specials score 0: random models then rarely emit EOS
    weights = {"model.embed_tokens.weight": embed,
               "model.norm.weight": mx.ones((h,))}
    if not c["tie_word_embeddings"]:
        head = w(c["vocab_size"], h) * 4
        head[: len(SPECIALS)] = 0
        weights["lm_head.weight"] = head
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights.update({
            p + "self_attn.q_proj.weight": w(n * d, h), p + "self_attn.k_proj.weight": w(kv * d, h),
            p + "self_attn.v_proj.weight": w(kv * d, h), p + "self_attn.o_proj.weight": w(h, n * d),
            p + "mlp.gate_proj.weight": w(inter, h), p + "mlp.up_proj.weight": w(inter, h),
            p + "mlp.down_proj.weight": w(h, inter),
            p + "input_layernorm.weight": mx.ones((h,)), p + "post_attention_layernorm.weight": mx.ones((h,)),
        })
        if c["attention_bias"]:
            for name, size in (("q", n * d), ("k", kv * d), ("v", kv * d)):
                weights[p + f"self_attn.{name}_proj.bias"] = w(size) * 0.1
        if c["model_type"] == "qwen3":
            for name in ("q", "k"):
                weights[p + f"self_attn.{name}_norm.weight"] = mx.array(
                    (1 + 0.2 * rng.standard_normal(d)).astype(np.float32))
    return weights


def logits_from_scratch(target, ids: list[int]) -> np.ndarray:
    """(len(ids), V) float32 logits of ``ids`` in a fresh cache: the naive reference."""

    cache = target.make_cache()
    return np.array(target.score(ids, cache).logits.astype(mx.float32))
