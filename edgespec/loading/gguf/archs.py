"""What each GGUF architecture edgespec reads means in Hugging Face terms: tensor names, the
``config.json`` built from its metadata, and how llama.cpp's converter changed the tensors.

- ``llama``: Q and K rows permuted for llama.cpp's interleaved RoPE (``tensors.unpermute_rows``
  undoes it).
- ``qwen2``, ``qwen3``: llama's names (qwen2 with q/k/v biases, qwen3 with per-head q/k norms);
  no permutation (llama.cpp runs their RoPE in Hugging Face's half-split order).
- ``gemma3`` (text): norm weights stored as ``1 + w`` (llama.cpp multiplies by the weight;
  Gemma's RMSNorm by ``1 + w``), so ``NORM_SHIFT`` is subtracted back. The metadata has no
  sliding-window pattern or local RoPE base in files written before those keys existed:
  llama.cpp's defaults apply (every 6th layer global, base 10000), and the attention scale is
  ``key_length ** -0.5`` except on the 62-layer 27B (``hidden / heads``), as in llama.cpp.

Names were checked against the ``gguf`` package's ``TensorNameMap`` (``tests/test_gguf.py``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import ModelLoadError, UnsupportedModelError

GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_ATTN_MLP = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
LAYER_NAMES = {
    "llama": {**_ATTN_MLP, "ffn_norm": "post_attention_layernorm"},
    "qwen2": {**_ATTN_MLP, "ffn_norm": "post_attention_layernorm"},
    "qwen3": {**_ATTN_MLP, **_QK_NORMS, "ffn_norm": "post_attention_layernorm"},
    "gemma3": {**_ATTN_MLP, **_QK_NORMS, "post_attention_norm": "post_attention_layernorm",
               "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"},
}
SUPPORTED_ARCHITECTURES = tuple(LAYER_NAMES)
PERMUTED_QK = ("llama",)
NORM_SHIFT = {"gemma3": 1.0}


def hf_name(gguf_name: str, arch: str = "llama", path: Path | str = "<gguf>") -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (and globals)."""
    layer_names = LAYER_NAMES[arch]
    stem, _, suffix = gguf_name.rpartition(".")
    parts = stem.split(".")
    if suffix in ("weight", "bias"):
        if len(parts) == 1 and stem in GLOBAL_NAMES:
            return f"{GLOBAL_NAMES[stem]}.{suffix}"
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer_names:
            return f"model.layers.{int(parts[1])}.{layer_names[parts[2]]}.{suffix}"
    known = ", ".join([*GLOBAL_NAMES, *(f"blk.N.{n}" for n in layer_names)])
    raise UnsupportedModelError(
        f"{path}: tensor {gguf_name!r} has no {arch} equivalent; known tensors: {known}")


def _number(value):
    """A metadata number as a plain int/float (float32 values printed at their shortest)."""
    if isinstance(value, float):
        return float(str(np.float32(value)))
    return value


def hf_config(meta: dict, tensor_names: set[str], path: Path) -> dict:
    """HF ``config.json`` (llama, qwen2, qwen3 or gemma3_text keys) from the GGUF
    hyperparameters."""
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
        "hidden_size": hidden, "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length"), "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads), "head_dim": head_dim,
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon"),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_position_embeddings": get("context_length", 2048), "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    if arch == "gemma3":
        scalar = hidden // heads if config["num_hidden_layers"] == 62 else head_dim
        config.update({
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": scalar,
            "sliding_window": get("attention.sliding_window"),
            "rope_local_base_freq": get("rope.freq_base_swa", 10000.0)})
        pattern = meta.get(f"{arch}.attention.sliding_window_pattern", 6)
        if isinstance(pattern, list):  # one flag per layer: True where it slides
            config["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
        else:
            config["sliding_window_pattern"] = pattern
    elif arch in ("qwen2", "qwen3"):
        config.update({"architectures": [f"Qwen{arch[-1]}ForCausalLM"], "model_type": arch,
                       "hidden_act": "silu", "use_sliding_window": False,
                       "attention_bias": "blk.0.attn_q.bias" in tensor_names})
    else:
        config.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                       "hidden_act": "silu", "mlp_bias": False,
                       "attention_bias": "blk.0.attn_q.bias" in tensor_names})
    scaling = get("rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": get("rope.scaling.factor")}
    elif scaling != "none":
        raise UnsupportedModelError(f"{path}: rope scaling {scaling!r} is not supported (linear only)")
    return config
