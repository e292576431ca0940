"""Tiny llama GGUF files and tokenizer directories for the tests.

The GGUF is written with ``gguf.GGUFWriter`` the way llama.cpp's converter writes one: Q and K rows
permuted for llama.cpp's RoPE, quantized tensors made by ``gguf.quants.quantize``. The original
(HF-order, float32) weights are returned so tests can compare the conversion against them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tokenizers
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES, GGUFWriter, quants
from tokenizers import decoders, models, pre_tokenizers, processors

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BYTES = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 byte-level symbols
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("l", "l"), ("ll", "o"), ("H", "e"), ("He", "llo"),
          ("Ġ", "w"), ("o", "r"), ("Ġw", "or"), ("Ġwor", "l"), ("Ġworl", "d"), ("Ã", "©"),
          ("ð", "Ł"), ("2", "0")]  # "é" as one token, an emoji's first two bytes as one, "20"
TOKENS = SPECIALS + BYTES + ["".join(m) for m in MERGES]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}\n"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128
HEAD_DIM = HIDDEN // HEADS
DEFAULT_TYPES = {  # GGUF tensor (without blk.N) -> type; mixes every supported type
    "token_embd": T.Q8_0, "attn_q": T.F32, "attn_k": T.Q4_0, "attn_v": T.F16,
    "attn_output": T.Q4_1, "ffn_gate": T.Q4_1, "ffn_up": T.BF16, "ffn_down": T.Q4_0,
    "attn_norm": T.F32, "ffn_norm": T.F32, "output_norm": T.F32, "output": T.F16,
}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf Q/K permutation (HF order -> GGUF order)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_weights(vocab_size: int, tied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights under their GGUF names, in HF (un-permuted) row order."""
    rng = np.random.default_rng(seed)
    shapes = {"token_embd": (vocab_size, HIDDEN), "output_norm": (HIDDEN,)}
    if not tied:
        shapes["output"] = (vocab_size, HIDDEN)
    per_layer = {"attn_q": (HEADS * HEAD_DIM, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
                 "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HIDDEN),
                 "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN),
                 "attn_norm": (HIDDEN,), "ffn_norm": (HIDDEN,)}
    for i in range(LAYERS):
        shapes.update({f"blk.{i}.{n}": s for n, s in per_layer.items()})
    return {f"{n}.weight": (rng.standard_normal(s) * 0.5).astype(np.float32) for n, s in shapes.items()}


def _encode_tensor(w: np.ndarray, qtype: T) -> tuple[np.ndarray, T | None]:
    if qtype == T.F32:
        return w, None
    if qtype == T.F16:
        return w.astype(np.float16), None
    try:
        return quants.quantize(w, qtype), qtype
    except NotImplementedError:  # gguf cannot make this type: random blocks of the right size
        block, size = GGML_QUANT_SIZES[qtype]
        rows, cols = w.shape
        return np.random.default_rng(0).integers(0, 256, (rows, cols // block * size), np.uint8), qtype


def _add_tokenizer(writer: GGUFWriter, pre: str, add_bos: bool) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(TOKENS)
    writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(CHAT_TEMPLATE)


def write_tiny_gguf(path: Path, *, arch: str = "llama", tied: bool = False, tokenizer: bool = True,
                    pre: str = "smollm", add_bos: bool = False, types: dict | None = None,
                    extra_tensors: dict | None = None) -> dict[str, np.ndarray]:
    """Write a 2-layer llama GGUF to ``path``; return its HF-order float32 weights (GGUF names)."""
    types = {**DEFAULT_TYPES, **(types or {})}
    weights = hf_weights(len(TOKENS), tied)
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_vocab_size(len(TOKENS))
    if tokenizer:
        _add_tokenizer(writer, pre, add_bos)
    for name, w in {**weights, **(extra_tensors or {})}.items():
        kind = name.split(".")[-2]
        stored = permute(w, HEADS if kind == "attn_q" else KV_HEADS) if kind in ("attn_q", "attn_k") else w
        data, raw = _encode_tensor(stored, types.get(kind, T.F32))
        writer.add_tensor(name, data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


def byte_level_tokenizer() -> tokenizers.Tokenizer:
    """The fixture vocabulary as an HF tokenizer built directly (independent of gguf.py)."""
    vocab = {t: i for i, t in enumerate(TOKENS)}
    tok = tokenizers.Tokenizer(models.BPE(vocab, MERGES))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return tok


def write_tokenizer_dir(path: Path, config: dict | None = None, generation: dict | None = None) -> Path:
    """A model directory holding only tokenizer files; ``config`` overrides tokenizer_config keys."""
    path.mkdir(parents=True, exist_ok=True)
    byte_level_tokenizer().save(str(path / "tokenizer.json"))
    base = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False,
            "chat_template": CHAT_TEMPLATE}
    (path / "tokenizer_config.json").write_text(json.dumps({**base, **(config or {})}))
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    return path
