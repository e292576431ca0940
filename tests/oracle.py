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
_LONG = [1.0, 1.3, 2.0, 3.1, 5.0, 8.5]  # one factor per rotated pair (12 of 16 dims)

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
    "smollm3-listed": {**_BASE, "model_type": "smollm3", "num_hidden_layers": 3,
                       "no_rope_layers": [0, 1, 0], "tie_word_embeddings": False},
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
    model_class, args_class = mlx_lm_classes(config)
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
    r = rng.normal(0, 1 if "embed" in name else w.shape[-1] ** -0.5, w.shape).astype(np.float32)
    if "embed" in name or "lm_head" in name:
        r[: len(SPECIALS)] = 0  # specials score 0: random models then rarely emit EOS
    return r


def load_oracle(path: Path):
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(path))
    return model


def oracle_logits(model, ids: list[int]) -> np.ndarray:
    """(len(ids), V) logits of mlx-lm's model over ``ids`` in one pass, no cache."""
    return np.array(model(mx.array(ids)[None])[0])


def oracle_decode(model, prefix: list[int], chain: list[int]) -> np.ndarray:
    """(len(chain), V): mlx-lm's own cache, prefilled with ``prefix``, then one token at a time."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array(prefix)[None], cache=cache)
    return np.stack([np.array(model(mx.array([[t]]), cache=cache)[0, -1]) for t in chain])
