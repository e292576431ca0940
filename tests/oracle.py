"""mlx-lm as the oracle for model math: tiny random model directories written from mlx-lm's own
modules, and mlx-lm's logits for a prefill, a decode chain and separate chains.

``make_oracle_model(out, config)`` instantiates mlx-lm's model for ``config`` (a config.json
without ``vocab_size``: the tiny byte-level tokenizer's is added), replaces every weight with
seeded random values (norm weights too, so a norm applied the wrong way shows), and saves
config.json, model.safetensors and the tokenizer. Both edgespec and ``mlx_lm.utils.load_model``
load that directory, so the comparison covers each side's loading (weight names, tying) too.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from .tiny import SPECIALS, write_tokenizer

_BASE = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
         "max_position_embeddings": 4096, "tie_word_embeddings": True}
_GEMMA3 = {**_BASE, "model_type": "gemma3_text", "num_hidden_layers": 4, "num_key_value_heads": 1,
           "head_dim": 16, "query_pre_attn_scalar": 16, "rms_norm_eps": 1e-6,
           "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "sliding_window": 8,
           "sliding_window_pattern": 2}
_GEMMA2 = {**_BASE, "model_type": "gemma2", "num_hidden_layers": 3, "num_key_value_heads": 2,
           "head_dim": 16, "query_pre_attn_scalar": 24, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
           "sliding_window": 4096}  # mlx-lm's gemma2 has no windows: this one is never reached
_PHI3 = {**_BASE, "model_type": "phi3", "tie_word_embeddings": False, "rope_theta": 10000.0}
# Gemma 4: layers s s F s s F (window 8), the last two reading layers 3 and 2's keys/values,
# head sizes 16 (sliding) and 32 (global, a quarter of it rotated), per-layer inputs of 8
_GEMMA4 = {**_BASE, "model_type": "gemma4_text", "num_hidden_layers": 6, "intermediate_size": 64,
           "num_key_value_heads": 1, "head_dim": 16, "global_head_dim": 32, "rms_norm_eps": 1e-6,
           "sliding_window": 8, "sliding_window_pattern": 3, "num_kv_shared_layers": 2,
           "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 300,
           "final_logit_softcapping": 5.0}
_GEMMA4_K_EQ_V = {  # keys as values on the global layers, no sharing, no per-layer inputs
    **_GEMMA4, "num_hidden_layers": 4, "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0,
    "attention_k_eq_v": True, "num_global_key_value_heads": 2, "tie_word_embeddings": False,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.5, "rope_theta": 50000.0,
                                           "rope_type": "proportional", "factor": 2.0},
                        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}}
_LONG = [1.0, 1.3, 2.0, 3.1, 5.0, 8.5]  # one factor per rotated pair (12 of 16 dims)
# Mixture of experts: 8 experts (4 in mixtral), top-2, experts 32 wide
_QWEN3_MOE = {**_BASE, "model_type": "qwen3_moe", "num_hidden_layers": 3, "head_dim": 16,
              "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "num_experts": 8,
              "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1,
              "mlp_only_layers": [1], "norm_topk_prob": True, "tie_word_embeddings": False}
# gpt-oss: layers s F s F (window 8), q/k/v/o biases, sinks, YaRN, clamped SwiGLU experts
_GPT_OSS = {**_BASE, "model_type": "gpt_oss", "num_hidden_layers": 4, "head_dim": 16,
            "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32,
            "sliding_window": 8, "rope_theta": 150000.0, "tie_word_embeddings": False,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "original_max_position_embeddings": 64}}
# Hybrid (recurrent) families. Qwen3.5: layers D A D A (gated DeltaNet, gated attention), 4 value
# heads over 2 key heads of 16, a quarter of each attention head rotated. Untied heads: the tied random
# ones' logits came within a hair of 1e-4 of mlx-lm's.
_LINEAR = {"linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
           "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4}
_QWEN3_5 = {**_BASE, **_LINEAR, "model_type": "qwen3_5", "num_hidden_layers": 4, "head_dim": 16,
            "full_attention_interval": 2, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0]}}
_QWEN3_5_MOE_TEXT = {**_QWEN3_5, "model_type": "qwen3_5_moe_text", "num_experts": 4,
                     "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                     "shared_expert_intermediate_size": 32, "tie_word_embeddings": False}
# Qwen3-Next: D D D A, experts (with a shared expert) on layers 1-3, a dense MLP on layer 0
_QWEN3_NEXT = {**_BASE, **_LINEAR, "model_type": "qwen3_next", "num_hidden_layers": 4,
               "head_dim": 16, "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
               "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
               "mlp_only_layers": [0], "moe_intermediate_size": 32,
               "shared_expert_intermediate_size": 32, "norm_topk_prob": True,
               "full_attention_interval": 4, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
# LFM2: conv, attention, conv, conv (window 3), feed-forward 2/3 of 128 rounded to 32s: 96
_LFM2 = {"model_type": "lfm2", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 4096, "norm_eps": 1e-5,
         "conv_bias": False, "conv_L_cache": 3, "block_dim": 64, "block_ff_dim": 128,
         "block_multiple_of": 32, "block_ffn_dim_multiplier": 1.0,
         "block_auto_adjust_ff_dim": True, "rope_theta": 1_000_000.0, "tie_word_embeddings": True,
         "layer_types": ["conv", "full_attention", "conv", "conv"]}

CONFIGS = {
    "llama": {**_BASE, "model_type": "llama", "rope_theta": 10000.0},
    "llama3-rope-untied": {**_BASE, "model_type": "llama", "rope_theta": 500000.0,
                           "tie_word_embeddings": False,
                           "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 64}},
    "llama-layer-types": {**_BASE, "model_type": "llama", "num_hidden_layers": 3,
                          "sliding_window": 8,
                          "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
    "qwen2": {**_BASE, "model_type": "qwen2", "rope_theta": 1_000_000.0},
    "qwen3": {**_BASE, "model_type": "qwen3", "head_dim": 32, "rms_norm_eps": 1e-6,
              "rope_theta": 1_000_000.0},
    "qwen3-untied": {**_BASE, "model_type": "qwen3", "head_dim": 16, "rms_norm_eps": 1e-6,
                     "rope_theta": 1_000_000.0, "tie_word_embeddings": False},
    "gemma3": _GEMMA3,
    "gemma3-untied-scaled": {**_GEMMA3, "tie_word_embeddings": False, "num_hidden_layers": 6,
                             "sliding_window_pattern": 3,
                             "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
    "gemma2": _GEMMA2,
    "phi3": _PHI3,
    "phi3-longrope-partial": {**_PHI3, "partial_rotary_factor": 0.75,
                              "max_position_embeddings": 4096,
                              "original_max_position_embeddings": 64,
                              "rope_scaling": {"type": "longrope", "long_factor": _LONG,
                                               "short_factor": [1.0] * 6}},
    "smollm3": {**_BASE, "model_type": "smollm3", "num_hidden_layers": 4, "rope_theta": 5e6,
                "no_rope_layer_interval": 2, "tie_word_embeddings": True},
    "gemma4_text": _GEMMA4,
    "gemma4_text-k-eq-v-untied": _GEMMA4_K_EQ_V,
    "gemma4_text-moe": {**_GEMMA4, "enable_moe_block": True, "num_experts": 4,
                        "top_k_experts": 2, "moe_intermediate_size": 32},
    "gemma4-nested": {"model_type": "gemma4", "tie_word_embeddings": True,  # mlx-vlm's layout
                      "text_config": {**_GEMMA4, "num_kv_shared_layers": 3}},
    "smollm3-listed": {**_BASE, "model_type": "smollm3", "num_hidden_layers": 3,
                       "no_rope_layers": [0, 1, 0], "tie_word_embeddings": False},
    "qwen3_moe": _QWEN3_MOE,
    "qwen3_moe-sparse-step-tied": {**_QWEN3_MOE, "num_hidden_layers": 4, "num_experts": 4,
                                   "decoder_sparse_step": 2, "mlp_only_layers": [],
                                   "norm_topk_prob": False, "tie_word_embeddings": True},
    "mixtral": {**_BASE, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2,
                "intermediate_size": 32, "rope_theta": 1_000_000.0, "tie_word_embeddings": False},
    "gpt_oss": _GPT_OSS,
    "qwen3_5": _QWEN3_5,
    "qwen3_5_moe-nested": {"model_type": "qwen3_5_moe", "tie_word_embeddings": False,
                           "text_config": _QWEN3_5_MOE_TEXT, "vision_config": {"depth": 1}},
    "qwen3_next": _QWEN3_NEXT,
    "lfm2": _LFM2,
    "lfm2-conv-bias": {**_LFM2, "conv_bias": True, "conv_L_cache": 4,
                       "layer_types": ["full_attention", "conv", "conv", "full_attention"]},
}
"""Windowed configs whose windows mlx-lm does not apply (gemma2): tested against plain and naive
decoding in ``tests/test_families.py``, never against mlx-lm."""
WINDOWED = {"gemma2-windowed": {**_GEMMA2, "num_hidden_layers": 4, "sliding_window": 8,
                                "tie_word_embeddings": True}}


def mlx_lm_classes(config: dict):
    from mlx_lm.utils import _get_classes

    return _get_classes(config)


def make_oracle_model(out: Path, config: dict, seed: int = 0) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = {**config, "vocab_size": write_tokenizer(out)}
    if "text_config" in config:  # mlx-lm's qwen3_5 reads the nested config only
        config["text_config"] = {"vocab_size": config["vocab_size"], **config["text_config"]}
    model_class, args_class = mlx_lm_classes(config)
    mx.random.seed(seed)  # some initial values stay in the weights (A_log is random in mlx-lm)
    model = model_class(args_class.from_dict(config))
    rng = np.random.default_rng(seed)
    weights = {}
    for name, w in tree_flatten(model.parameters()):
        if name == "lm_head.weight" and config["tie_word_embeddings"]:
            continue  # mlx-lm ties when the checkpoint has no head (gemma3)
        weights[name] = mx.array(_random_like(name, np.array(w), rng))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    return out


def _random_like(name: str, w: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if w.ndim == 1:  # norm weights around their init (1 or 0), biases around 0
        return (w + rng.uniform(-0.4, 0.4, w.shape)).astype(np.float32)
    fan_in = w.shape[1] if w.ndim == 3 and w.shape[-1] == 1 else w.shape[-1]  # depthwise conv
    r = rng.normal(0, 1 if "embed" in name else fan_in ** -0.5, w.shape).astype(np.float32)
    if "embed" in name or "lm_head" in name:
        r[: len(SPECIALS)] = 0  # specials score 0: random models then rarely emit EOS
    return r


def load_oracle(path: Path):
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(path))
    return model


def quantize_oracle_model(path: Path, bits: int = 4, group_size: int = 32) -> None:
    """Rewrite the model directory ``path`` as mlx-lm's quantized checkpoint of it (its
    ``nn.quantize``d weights, ``quantization`` in config.json; a tied model saves no head)."""
    import mlx.nn as nn

    nn.quantize(model := load_oracle(path), group_size=group_size, bits=bits)
    weights = dict(tree_flatten(model.parameters()))
    config = json.loads((Path(path) / "config.json").read_text())
    if config.get("tie_word_embeddings"):
        weights = {k: v for k, v in weights.items() if not k.startswith("lm_head")}
    mx.save_safetensors(str(Path(path) / "model.safetensors"), weights)
    config["quantization"] = {"group_size": group_size, "bits": bits}
    (Path(path) / "config.json").write_text(json.dumps(config))


def oracle_logits(model, ids: list[int]) -> np.ndarray:
    """(len(ids), V) logits of mlx-lm's model over ``ids`` in one pass, no cache."""
    return np.array(model(mx.array(ids)[None])[0])


def oracle_decode(model, prefix: list[int], chain: list[int]) -> np.ndarray:
    """(len(chain), V): mlx-lm's own cache, prefilled with ``prefix``, then one token at a time."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array(prefix)[None], cache=cache)
    return np.stack([np.array(model(mx.array([[t]]), cache=cache)[0, -1]) for t in chain])
