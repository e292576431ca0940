"""Gemma 4 beyond the per-family checks of ``tests/test_families.py`` (which compare its configs
with mlx-lm): KV sharing through rejected drafts past a window boundary, layer subsets that
would lose a shared layer's source, a 4-bit checkpoint kept quantized, and the multimodal
checkpoints' layouts (Hugging Face's names, vision/audio towers dropped).
"""

from __future__ import annotations

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from edgespec import Engine, SamplingConfig
from edgespec.cache import KVCache
from edgespec.drafters.layer_skip import LayerSkipDrafter
from edgespec.drafters.lookup import PromptLookupDrafter
from edgespec.errors import ConfigError
from edgespec.targets import load_target

from .oracle import CONFIGS, load_oracle, make_oracle_model, oracle_logits
from .test_families import _ids, _naive_greedy, drafters_through_rollback

pytest.importorskip("mlx_lm")

GREEDY = SamplingConfig()
UNTIED = {**CONFIGS["gemma4_text"], "tie_word_embeddings": False}  # layers 4, 5 read 3, 2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4")
    target = load_target(make_oracle_model(root / "t", UNTIED), dtype="float32")
    other = load_target(make_oracle_model(root / "d", UNTIED, seed=5), dtype="float32")
    return target, other


def test_shared_layers_through_rollback(models):
    """Rejected drafts past the window boundary (the sliding layers compact): plain decoding
    equals naive recomputation and every drafter's greedy output equals plain decoding's; the
    shared layers hold no entries of their own and follow their sources' compaction."""
    target, other = models
    assert target.model.kv_sources() == [0, 1, 2, 3, 3, 2]
    prompt = _ids(360, 7)
    want, (early, skip, _) = drafters_through_rollback(target, other, prompt, 20, 4, [0, 2, 3, 5])
    lookup = PromptLookupDrafter(max_branches=3)
    assert Engine(target, lookup).generate(prompt, max_tokens=20).token_ids == want
    cache = early.lower.cache  # the target's own: early exit feeds layers 0-3, verifies 4-5
    assert cache.sources == (0, 1, 2, 3, 3, 2)
    assert cache.keys[4] is None and cache.keys[5] is None
    assert cache.starts[4] == cache.starts[3] > 0 and cache.starts[5] == cache.starts[2] == 0
    assert skip.cache.sources == (0, 1, 2, 1)  # slot 3 (layer 5) reads slot 1 (layer 2)


def test_tree_commit_keeps_shared_entries_exact(models):
    """A tree verify then ``commit(path)`` of a branch: the next forward matches scoring the
    whole accepted sequence afresh (the shared layers read the gathered source entries)."""
    from edgespec.tree import DraftTree

    target, _ = models
    ids = _ids(30, 3)
    cache = target.make_cache()
    target.score(ids, cache, head=False)
    cache.commit()
    tree = DraftTree([11, 12, 13, 14, 15, 16], [-1, 0, 0, 2, 2, 4])
    target.score(tree, cache)
    cache.commit([0, 2, 4, 5])
    nxt = np.array(target.score([17], cache).logits[-1])
    fresh = np.array(target.score(ids + [11, 13, 15, 16, 17], target.make_cache()).logits[-1])
    assert np.max(np.abs(nxt - fresh)) < 1e-4


def test_sharing_without_a_source_is_refused_at_load():
    from edgespec.errors import UnsupportedModelError
    from edgespec.targets.gemma4 import Model, ModelArgs

    config = {**CONFIGS["gemma4_text"], "vocab_size": 300, "num_kv_shared_layers": 1,
              "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
    with pytest.raises(UnsupportedModelError, match="num_kv_shared_layers 1 of 6"):
        Model(ModelArgs.from_dict(config))  # layer 5 is the only global layer: nothing to read


def test_make_draft_refuses_and_names_early_exit(tmp_path):
    from edgespec.targets.derive import truncate_model

    path = make_oracle_model(tmp_path / "m", CONFIGS["gemma4-nested"])
    with pytest.raises(ConfigError, match="'gemma4'.*--method early-exit"):
        truncate_model(path, 2, tmp_path / "out")


def test_layer_subset_without_a_source_is_refused(models):
    target, _ = models
    with pytest.raises(ConfigError, match=r"4 reads 3"):
        LayerSkipDrafter(target, GREEDY, layers=[0, 1, 4, 5], num_draft=4)
    with pytest.raises(ValueError, match="sources"):
        KVCache(3, sources=[0, 2, 1])


def test_layer_search_keeps_the_shared_layers_sources(models):
    """The calibration's greedy search drops layers 2 and 3 only after the layers reading them."""
    from edgespec.drafters.calibrate import search_layer_subset

    target, _ = models
    res = search_layer_subset(target, _ids(40, 5), tokens=16, max_forwards=12, patience=4)
    assert len(res.table) >= 3
    for row in res.table:
        layers = row["layers"]
        assert all(s in layers for s in (target.model.kv_sources()[i] for i in layers)), layers
        LayerSkipDrafter(target, GREEDY, layers=layers)  # a cache for it can be made


_MOE = {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32}
QUANTIZED = {
    "dense": {**CONFIGS["gemma4_text"], "hidden_size_per_layer_input": 32},  # all 4-bit
    "moe": CONFIGS["gemma4_text-moe"],
    "nested-moe": {**CONFIGS["gemma4-nested"],
                   "text_config": {**CONFIGS["gemma4-nested"]["text_config"], **_MOE}},
}


@pytest.mark.parametrize("name", list(QUANTIZED))
@pytest.mark.usefixtures("float_activations")
def test_4bit_checkpoint_matches_mlx_lm(tmp_path, name):
    """Quantized as ``mlx_lm.convert`` does (4-bit, the router at 8 bits: per-layer entries in
    the config, under ``language_model.`` in the nested layout) and kept quantized; within 1e-4
    of mlx-lm with MLX's own quantized products, as the oracle runs them. The native 4-bit
    kernels (the default path) round differently (on a 3x64 by 64x32 product, 7e-7 from a
    float64 product where MLX's is 3e-6), which the random MoE model amplifies to 1.3e-4 at
    one of the 24 positions: checked at 2e-4."""
    from mlx_lm.utils import quantize_model

    from edgespec.kernels.backend import set_native_enabled

    path = make_oracle_model(tmp_path, QUANTIZED[name])
    config = json.loads((path / "config.json").read_text())
    model, config = quantize_model(load_oracle(path), config, group_size=32, bits=4)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (path / "config.json").write_text(json.dumps(config))
    target, oracle = load_target(path, dtype="auto"), load_oracle(path)
    assert target.quantized
    layer = target.model.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, nn.QuantizedLinear)
    if name == "dense":
        assert isinstance(target.model.model.embed_tokens_per_layer, nn.QuantizedEmbedding)
        assert isinstance(layer.per_layer_projection, nn.QuantizedLinear)
    if "moe" in name:
        assert layer.router.proj.bits == 8 and layer.experts.switch_glu.up_proj.bits == 4
    ids = _ids(24, 9)
    want = oracle_logits(oracle, ids)
    assert np.max(np.abs(np.array(target.score(ids, target.make_cache()).logits) - want)) < 2e-4
    set_native_enabled(False)
    try:
        ours = np.array(target.score(ids, target.make_cache()).logits)
    finally:
        set_native_enabled(True)  # the default (EDGESPEC_NATIVE=0 is read elsewhere)
    assert np.max(np.abs(ours - want)) < 1e-4


def test_hugging_face_multimodal_layout_loads_the_text_model(tmp_path):
    """``gemma4`` as Hugging Face ships it: ``model.language_model.*`` weights beside vision
    and audio towers, each layer's experts fused (``experts.gate_up_proj`` (E, 2I, D),
    ``experts.down_proj``); the towers are dropped and the text model matches mlx-lm's."""
    path = make_oracle_model(tmp_path, QUANTIZED["nested-moe"])
    oracle = load_oracle(path)
    weights = mx.load(str(path / "model.safetensors"))
    renamed = {"model." + k.replace("language_model.model.", "language_model."): v
               for k, v in weights.items() if ".switch_glu." not in k}
    for k, v in weights.items():
        if k.endswith("switch_glu.gate_proj.weight"):
            layer = "model." + k.replace("language_model.model.", "language_model.").split(
                ".switch_glu.")[0]
            up = weights[k.replace("gate_proj", "up_proj")]
            renamed[layer + ".gate_up_proj"] = mx.concatenate([v, up], axis=1)
            renamed[layer + ".down_proj"] = weights[k.replace("gate_proj", "down_proj")]
    renamed["model.vision_tower.encoder.weight"] = mx.zeros((4, 4))
    renamed["model.audio_tower.conv.weight"] = mx.zeros((4, 4))
    renamed["model.embed_vision.embedding_projection.weight"] = mx.zeros((4, 4))
    mx.save_safetensors(str(path / "model.safetensors"), renamed)
    assert "model.language_model.layers.0.experts.gate_up_proj" in renamed
    with pytest.warns(UserWarning, match="3 vision/audio tower tensors not loaded.*mlx_vlm"):
        target = load_target(path, dtype="float32")
    assert target.args.model_type == "gemma4_text" and target.model.kv_sources()[3:] == [1, 1, 2]
    ids = _ids(20, 4)
    ours = np.array(target.score(ids, target.make_cache()).logits)
    assert np.max(np.abs(ours - oracle_logits(oracle, ids))) < 1e-4
