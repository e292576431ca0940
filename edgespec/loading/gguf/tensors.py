"""GGUF tensors -> HF-named MLX arrays (the weights half of the GGUF conversion; see ``convert.py``).

:func:`~edgespec.loading.gguf.convert.convert_gguf` writes ``config.json`` (HF llama keys), ``model.safetensors`` (HF
tensor names), ``tokenizer.json``, ``tokenizer_config.json`` and ``generation_config.json`` into a
temporary sibling directory and renames it into place, so an interrupted conversion never leaves a
half-written model directory. Every failure is a typed error naming the file: a corrupt or truncated
file -> :class:`ModelLoadError`; an architecture or tensor type it cannot map ->
:class:`UnsupportedModelError`; tokenizer metadata it cannot rebuild -> :class:`TokenizerError`.

Tensors are read with ``mx.load`` (MLX parses GGUF natively); types are checked first with the
``gguf`` package's reader, because ``mx.load`` fails on some types without naming the tensor,
silently drops others (TQ1_0, MXFP4) and dequantizes Q4_K wrongly (mlx 0.32). What it returns:

====================  =========================================================================
GGUF type             ``mx.load`` result -> what we write
====================  =========================================================================
F32, F16              float32 / float16 array -> written as is
BF16                  float16 (lossy) -> re-read with ``gguf`` and written as bfloat16
Q4_0, Q4_1, Q8_0      MLX affine triplet ``<stem>.weight`` (uint32, packed), ``<stem>.scales``,
                      ``<stem>.biases`` (float16), group size 32, 4/4/8 bits -> kept quantized
anything else         not supported: :class:`UnsupportedModelError`
====================  =========================================================================

Quantized tensors stay quantized: ``config["quantization"] = {"group_size": 32, "bits": B}`` with B
the most common width, plus a per-module override for tensors of another width, e.g.
``{"group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}}`` (the mlx-lm
convention). Dense tensors (norms, F32/F16 layers) carry no ``.scales`` and load as plain arrays.

llama.cpp permutes the rows of Q and K for its interleaved RoPE; :func:`unpermute_rows` restores the
HF order (rows of weight, scales and biases alike), so the output uses HF's half-split RoPE.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, quants
from tqdm import tqdm

from ...errors import ModelLoadError, UnsupportedModelError

CONVERTER_VERSION = 1
"""Bump when the output of :func:`convert_gguf` changes; hub.py keys its cache on it."""

SUPPORTED_ARCHITECTURES = ("llama",)
GROUP_SIZE = 32
QUANT_BITS = {T.Q4_0: 4, T.Q4_1: 4, T.Q8_0: 8}
DENSE_TYPES = (T.F32, T.F16, T.BF16)
SUPPORTED_TYPES = tuple(t.name for t in (*DENSE_TYPES, *QUANT_BITS))

_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def hf_name(gguf_name: str, path: Path | str = "<gguf>") -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (and globals)."""
    stem, _, suffix = gguf_name.rpartition(".")
    parts = stem.split(".")
    if suffix in ("weight", "bias"):
        if len(parts) == 1 and stem in _GLOBAL_NAMES:
            return f"{_GLOBAL_NAMES[stem]}.{suffix}"
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
            return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    known = ", ".join([*_GLOBAL_NAMES, *(f"blk.N.{n}" for n in _LAYER_NAMES)])
    raise UnsupportedModelError(
        f"{path}: tensor {gguf_name!r} has no llama equivalent; known tensors: {known}")


def permute_rows(w: mx.array, n_head: int) -> mx.array:
    """llama.cpp's Q/K row permutation (convert_hf_to_gguf); the inverse of :func:`unpermute_rows`."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w: mx.array, n_head: int) -> mx.array:
    """Undo llama.cpp's Q/K row permutation: rows (head, pair, half) -> (head, half, pair)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_metadata(path: Path) -> tuple[GGUFReader, dict]:
    """The parsed file and its key/value metadata as Python values; ModelLoadError if corrupt."""
    try:
        reader = GGUFReader(path)
        meta = {key: field.contents() for key, field in reader.fields.items()}
    except (ValueError, IndexError, KeyError, OSError, UnicodeDecodeError) as e:
        raise ModelLoadError(
            f"cannot read GGUF file {path}: {e} (corrupt, truncated or not a GGUF file?)") from e
    return reader, meta


def _check_supported(reader: GGUFReader, meta: dict, path: Path) -> None:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: architecture {arch!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    for t in reader.tensors:
        if t.tensor_type not in DENSE_TYPES and t.tensor_type not in QUANT_BITS:
            raise UnsupportedModelError(
                f"{path}: tensor {t.name!r} has type {t.tensor_type.name}; supported types: "
                f"{', '.join(SUPPORTED_TYPES)}")


def _number(value):
    """A metadata number as a plain int/float (float32 values printed at their shortest)."""
    if isinstance(value, float):
        return float(str(np.float32(value)))
    return value


def hf_config(meta: dict, tensor_names: set[str], path: Path) -> dict:
    """HF llama ``config.json`` from the GGUF hyperparameters."""
    arch = meta["general.architecture"]

    def get(key, default=...):
        value = meta.get(f"{arch}.{key}", default)
        if value is ...:
            raise ModelLoadError(f"{path}: metadata key {arch}.{key!r} is missing")
        if isinstance(value, list):
            raise UnsupportedModelError(f"{path}: per-layer {arch}.{key} is not supported")
        return _number(value)

    hidden, heads = get("embedding_length"), get("attention.head_count")
    head_dim = get("attention.key_length", hidden // heads)
    if get("rope.dimension_count", head_dim) != head_dim:
        raise UnsupportedModelError(f"{path}: partial rotary embeddings "
                                    f"({get('rope.dimension_count')} of {head_dim} dims) are not supported")
    vocab = get("vocab_size", None) or len(meta.get("tokenizer.ggml.tokens") or ())
    if not vocab:
        raise ModelLoadError(f"{path}: neither {arch}.vocab_size nor tokenizer.ggml.tokens is present")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": hidden, "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length"), "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads), "head_dim": head_dim,
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon"),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_position_embeddings": get("context_length", 2048), "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names, "mlp_bias": False,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    scaling = get("rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": get("rope.scaling.factor")}
    elif scaling != "none":
        raise UnsupportedModelError(f"{path}: rope scaling {scaling!r} is not supported (linear only)")
    return config


def _load_arrays(path: Path) -> dict[str, mx.array]:
    try:
        return mx.load(str(path))
    except (RuntimeError, ValueError, OSError) as e:
        raise ModelLoadError(f"cannot read the tensors of {path}: {e}") from e


def _tensor_parts(tensor, arrays: dict, path: Path) -> dict[str, mx.array]:
    """``{"weight": w}`` / ``{"bias": b}`` for dense tensors; weight, scales, biases if quantized."""
    stem, _, suffix = tensor.name.rpartition(".")
    try:
        if tensor.tensor_type == T.BF16:  # mx.load would round it to float16
            return {suffix: mx.array(quants.dequantize(tensor.data, T.BF16)).astype(mx.bfloat16)}
        if tensor.tensor_type in DENSE_TYPES:
            return {suffix: arrays[tensor.name]}
        return {"weight": arrays[tensor.name], "scales": arrays[f"{stem}.scales"],
                "biases": arrays[f"{stem}.biases"]}
    except KeyError as e:
        raise ModelLoadError(f"{path}: MLX did not return tensor {e} ({tensor.tensor_type.name})") from e


def convert_tensors(reader: GGUFReader, config: dict, path: Path, progress: bool = True):
    """HF-named weights and the mlx-lm ``quantization`` config (None when nothing is quantized)."""
    arrays = _load_arrays(path)
    heads = {"self_attn.q_proj": config["num_attention_heads"],
             "self_attn.k_proj": config["num_key_value_heads"]}
    weights, bits = {}, {}
    for tensor in tqdm(reader.tensors, desc=f"converting {path.name}", unit="tensor",
                       file=sys.stderr, disable=not progress):
        module = hf_name(tensor.name, path).rpartition(".")[0]
        n_head = heads.get(module.split(".", 3)[-1])  # "model.layers.N.<this>"; None: not Q/K
        for suffix, array in _tensor_parts(tensor, arrays, path).items():
            weights[f"{module}.{suffix}"] = array if n_head is None else unpermute_rows(array, n_head)
        if tensor.tensor_type in QUANT_BITS:
            bits[module] = QUANT_BITS[tensor.tensor_type]
    _check_complete(weights, config, path)
    return weights, quantization_config(bits)


def quantization_config(bits: dict[str, int]) -> dict | None:
    """mlx-lm ``quantization``: the most common width, plus per-module overrides for the others."""
    if not bits:
        return None
    default = Counter(bits.values()).most_common(1)[0][0]
    config: dict = {"group_size": GROUP_SIZE, "bits": default}
    for module, b in sorted(bits.items()):
        if b != default:
            config[module] = {"group_size": GROUP_SIZE, "bits": b}
    return config


def _check_complete(weights: dict, config: dict, path: Path) -> None:
    per_layer = [f"{n}.weight" for n in _LAYER_NAMES.values()]
    needed = ["model.embed_tokens.weight", "model.norm.weight"] + [
        f"model.layers.{i}.{n}" for i in range(config["num_hidden_layers"]) for n in per_layer]
    missing = [n for n in needed if n not in weights]
    if missing:
        raise ModelLoadError(f"{path}: tensors missing for {len(missing)} weights, "
                             f"e.g. {', '.join(missing[:3])}")
