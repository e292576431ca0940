"""Mixture-of-experts targets beyond ``test_families.py``'s parametrized checks (which run
qwen3_moe, mixtral and gpt_oss against mlx-lm): the batched expert path against its naive
per-row twin, 4-bit checkpoints kept quantized (mlx-lm's own quantization, routers at 8 bits)
against mlx-lm, Hugging Face's per-expert and fused layouts against mlx-lm's stacked one,
gpt-oss's alternating windows and sinks through rollback, and the typed errors.
"""

from __future__ import annotations

import json
import weakref
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from edgespec import Engine, SamplingConfig
from edgespec.drafters.draft_model import DraftModelDrafter
from edgespec.drafters.early_exit import EarlyExitDrafter
from edgespec.drafters.layer_skip import LayerSkipDrafter
from edgespec.drafters.lookup import PromptLookupDrafter
from edgespec.errors import ModelLoadError, UnsupportedModelError
from edgespec.targets import load_target
from edgespec.targets.experts import (SparseMoE, SwitchGLU, experts_loop, route, stack_experts,
                                      swiglu_oai)

from .oracle import CONFIGS, load_oracle, make_oracle_model, oracle_logits
from .test_families import _ids, _naive_greedy

pytest.importorskip("mlx_lm")

ATOL = 1e-4
GREEDY = SamplingConfig()


def _close(ours, want, what: str) -> None:
    diff = float(np.max(np.abs(np.array(ours) - np.array(want))))
    assert diff < ATOL, f"{what}: max |difference| {diff:.2e} (tolerance {ATOL})"


@pytest.mark.parametrize("rows", [1, 5, 40])  # 40 rows x top-3: 120 pairs, many per expert
@pytest.mark.parametrize("kind", ["float", "bias-oai", "4-bit"])
@pytest.mark.usefixtures("float_activations")
def test_batched_experts_equal_a_naive_per_row_loop(rows, kind):
    """Both batched forms (each expert's rows in one product; sorted pairs through gather_mm)
    against every row and expert one at a time."""
    mx.random.seed(rows)
    glu = {"glu": partial(swiglu_oai, limit=1.5)} if kind == "bias-oai" else {}
    experts = SwitchGLU(64, 32, 8, bias=kind == "bias-oai", **glu)
    if kind == "bias-oai":
        for lin in (experts.gate_proj, experts.up_proj, experts.down_proj):
            lin.bias = mx.random.normal(lin.bias.shape)
    if kind == "4-bit":
        nn.quantize(experts, group_size=32, bits=4)
        assert type(experts.down_proj).__name__ == "QuantizedSwitchLinear"
    x = mx.random.normal((1, rows, 64))
    inds = mx.argsort(mx.random.normal((1, rows, 8)), axis=-1)[..., :3]  # 3 distinct per row
    want = experts_loop(experts, x, inds)
    _close(experts.grouped(x, inds), want, f"{kind}, one product per expert")
    _close(experts.gathered(x, inds), want, f"{kind}, gather_mm over sorted pairs")
    _close(experts(x, inds), want, kind)


def test_route_scorings():
    logits = mx.array([[0.0, 2.0, 1.0, -1.0]])
    inds, w = route(logits, 2, "softmax")
    assert sorted(inds.tolist()[0]) == [1, 2]
    p = np.exp([0.0, 2.0, 1.0, -1.0]) / np.exp([0.0, 2.0, 1.0, -1.0]).sum()
    np.testing.assert_allclose(sorted(w.tolist()[0]), sorted(p[[1, 2]]), rtol=1e-6)
    _, w = route(logits, 2, "softmax", norm_topk_prob=True)
    np.testing.assert_allclose(float(w.sum()), 1.0, rtol=1e-6)
    _, w = route(logits, 2, "topk_softmax")
    want = [1 / (1 + np.e), np.e / (1 + np.e)]
    np.testing.assert_allclose(sorted(w.tolist()[0]), want, rtol=1e-6)
    with pytest.raises(UnsupportedModelError, match="'sigmoid'.*softmax, topk_softmax"):
        route(logits, 2, "sigmoid")
    with pytest.raises(UnsupportedModelError, match="num_experts_per_tok 5 must be in"):
        SparseMoE(8, 4, 4, 5)


@pytest.mark.parametrize("name,mode", [("qwen3_moe", "affine"), ("mixtral", "affine"),
                                       ("gpt_oss", "affine"), ("gpt_oss", "mxfp4")])
@pytest.mark.usefixtures("float_activations")
def test_quantized_checkpoint_matches_mlx_lm(tmp_path, name, mode):
    """mlx-lm's own 4-bit conversion (its quant_predicate: the routers of qwen3_moe and gpt_oss
    at 8 bits, recorded per layer in the config; mlx-community's gpt-oss in MXFP4), kept
    quantized."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import quantize_model

    path = make_oracle_model(tmp_path, CONFIGS[name])
    config = json.loads((path / "config.json").read_text())
    model, config = quantize_model(load_oracle(path), config, 32, 4, mode=mode)
    weights = dict(tree_flatten(model.parameters()))
    if config["tie_word_embeddings"]:
        weights = {k: v for k, v in weights.items() if not k.startswith("lm_head")}
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps(config))
    target, oracle = load_target(path, dtype="auto"), load_oracle(path)
    assert target.quantized
    kinds = {type(m).__name__ for _, m in target.model.named_modules()}
    assert "QuantizedSwitchLinear" in kinds
    ids = _ids(24, 9)
    _close(target.score(ids, target.make_cache()).logits, oracle_logits(oracle, ids), name)


def _unstack(weights: dict, src: str, dst: str, names: dict[str, str]) -> dict:
    """mlx-lm's stacked ``<p>.<src>.<name>.weight`` as Hugging Face's per-expert tensors."""
    out = {}
    for k, v in weights.items():
        head, sep, tail = k.partition(f".{src}.")
        if sep and tail.split(".")[0] in names:
            name, kind = tail.split(".")
            for e in range(v.shape[0]):
                out[f"{head}.{dst}.{e}.{names[name]}.{kind}"] = v[e]
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("name,src,names", [
    ("qwen3_moe", "mlp.switch_mlp", {"gate_proj": "gate_proj", "up_proj": "up_proj",
                                     "down_proj": "down_proj"}),
    ("mixtral", "block_sparse_moe.switch_mlp", {"gate_proj": "w1", "up_proj": "w3",
                                                "down_proj": "w2"})])
def test_hugging_face_per_expert_weights_load(tmp_path, name, src, names):
    path = make_oracle_model(tmp_path, CONFIGS[name])
    want = oracle_logits(load_oracle(path), _ids(16, 4))
    stacked = mx.load(str(path / "model.safetensors"))
    dst = src.replace("switch_mlp", "experts")
    mx.save_safetensors(str(path / "model.safetensors"), _unstack(stacked, src, dst, names))
    target = load_target(path, dtype="float32")
    _close(target.score(_ids(16, 4), target.make_cache()).logits, want, name)
    weights = _unstack(stacked, src, dst, names)
    weights.pop(next(k for k in weights if ".experts.3." in k))
    with pytest.raises(ModelLoadError, match=r"experts \[3\] have no"):
        stack_experts(weights, CONFIGS[name].get("num_experts", 4),
                      names={v: k for k, v in names.items()})


def test_gpt_oss_openai_layout_loads(tmp_path):
    """OpenAI's fused ``gate_up_proj`` (gate and up rows interleaved) and ``*_bias`` tensors."""
    path = make_oracle_model(tmp_path, CONFIGS["gpt_oss"])
    want = oracle_logits(load_oracle(path), _ids(16, 5))
    stacked, out = mx.load(str(path / "model.safetensors")), {}
    for k, v in stacked.items():
        head, sep, tail = k.partition(".mlp.experts.")
        suffix = "_bias" if tail.endswith(".bias") else ""
        if not sep:
            out[k] = v
        elif tail.startswith("gate_proj"):
            up = stacked[k.replace("gate_proj", "up_proj")]  # rows: g0, u0, g1, u1, ...
            fused = mx.stack([v, up], axis=2).reshape(v.shape[0], -1, *v.shape[2:])
            out[f"{head}.mlp.experts.gate_up_proj{suffix}"] = fused
        elif tail.startswith("down_proj"):
            out[f"{head}.mlp.experts.down_proj{suffix}"] = v
    mx.save_safetensors(str(path / "model.safetensors"), out)
    target = load_target(path, dtype="float32")
    _close(target.score(_ids(16, 5), target.make_cache()).logits, want, "gpt_oss openai layout")


def test_gpt_oss_openai_mxfp4_checkpoint_loads(tmp_path):
    """OpenAI's own checkpoint layout: MXFP4 experts as ``*_blocks`` (uint8, two values a
    byte) and ``*_scales``, gate and up interleaved, ``quantization_config`` quant_method
    mxfp4, everything else unquantized; against mlx-lm on the same experts in its layout."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import quantize_model

    path = make_oracle_model(tmp_path, CONFIGS["gpt_oss"])
    config = json.loads((path / "config.json").read_text())
    model, mlx_config = quantize_model(load_oracle(path), config, 32, 4, mode="mxfp4",
                                       quant_predicate=lambda p, m: ".experts." in p)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps(mlx_config))
    want = oracle_logits(load_oracle(path), _ids(16, 6))
    out = {}
    for k, v in weights.items():
        head, sep, tail = k.partition(".mlp.experts.")
        name, _, kind = tail.partition(".")
        if not sep or name == "up_proj":
            out.update({} if sep else {k: v})
            continue
        if kind == "weight":  # (E, out, in / 8) uint32 -> (E, out, in / 32, 16) uint8
            v, kind = v.view(mx.uint8).reshape(*v.shape[:2], -1, 16), "blocks"
        if name == "gate_proj":
            up = weights[f"{head}.mlp.experts.up_proj.{tail.partition('.')[2]}"]
            up = up.view(mx.uint8).reshape(v.shape) if kind == "blocks" else up
            v = mx.stack([v, up], axis=2).reshape(v.shape[0], -1, *v.shape[2:])
            name = "gate_up_proj"
        out[f"{head}.mlp.experts.{name}_{kind}"] = v
    mx.save_safetensors(str(path / "model.safetensors"), out)
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": {
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}}))
    target = load_target(path, dtype="auto")
    assert target.quantized
    _close(target.score(_ids(16, 6), target.make_cache()).logits, want, "openai mxfp4")
    target = load_target(path, dtype="float32")  # dequantized (mxfp4 scales are exponents)
    assert not target.quantized
    _close(target.score(_ids(16, 6), target.make_cache()).logits, want, "openai mxfp4, float32")


def test_gpt_oss_windows_and_sinks_through_rollback(tmp_path):
    """gpt-oss's sliding (window 8) and full layers, with sinks, through rejected drafts past the
    window: plain decoding equals naive recomputation; every drafter's output equals plain's."""
    target = load_target(make_oracle_model(tmp_path / "t", CONFIGS["gpt_oss"]), dtype="float32")
    other = load_target(make_oracle_model(tmp_path / "d", CONFIGS["gpt_oss"], seed=5),
                        dtype="float32")
    assert target.make_cache().windows == (8, None, 8, None)
    prompt = _ids(360, 7)  # past window + rollback + 256 slots: the sliding layers compact
    want = Engine(target).generate(prompt, max_tokens=16).token_ids
    assert want == _naive_greedy(target, prompt, 16)
    early = EarlyExitDrafter(target, GREEDY, exit_layer=2, num_draft=4, adaptive=False)
    skip = LayerSkipDrafter(target, GREEDY, layers=[0, 1, 3], num_draft=4, adaptive=False)
    draft = DraftModelDrafter(other, GREEDY, num_draft=4, max_draft=4, adaptive=False)
    for d in (early, skip, draft):
        res = Engine(target, d).generate(prompt, max_tokens=16)
        assert res.token_ids == want, d.name
        assert res.stats.proposed > 0 and res.stats.acceptance_rate < 1.0, d.name
    assert draft.cache.starts[0] > 0 and draft.cache.starts[1] == 0  # sliding compacted
    lookup = PromptLookupDrafter(max_branches=3)
    assert Engine(target, lookup).generate(prompt, max_tokens=16).token_ids == want


def test_cost_curve_is_measured_on_the_moe_model_itself(tmp_path, monkeypatch):
    """The verify-cost curve tree sizing reads is measured on the MoE target (its forwards run
    the expert layers), keyed by what decides its cost: the experts, k, and which layers are
    sparse (a list field). (Adaptive drafters get ``verify_cost_curve(target)``, the target's
    own: ``drafters/registry.py``.)"""
    from edgespec.targets import cost

    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cost, "_memo", {})
    monkeypatch.setattr(cost, "_by_target", weakref.WeakKeyDictionary())
    config = CONFIGS["qwen3_moe"]
    moe = load_target(make_oracle_model(tmp_path / "a", config), dtype="float32")
    curve = cost.measure_cost_curve(moe, sizes=(1, 4, 16), context=16, repeats=1)
    assert curve.sizes == (1, 4, 16) and 0 < curve.times[0] <= curve.times[1] <= curve.times[2]
    keys = {cost.curve_key(load_target(make_oracle_model(tmp_path / n, c), dtype="float32"))
            for n, c in [("b", {**config, "num_experts_per_tok": 4}),
                         ("c", {**config, "mlp_only_layers": [0]}), ("d", CONFIGS["qwen3"])]}
    assert cost.curve_key(moe) not in keys and len(keys) == 3
    measured = []

    def measure(target):
        measured.append(target)
        return cost.measure_cost_curve(target, sizes=(1, 2, 4), context=16, repeats=1)

    assert cost.verify_cost_curve(moe, measure).key == cost.curve_key(moe)
    assert measured == [moe]


# A MoE forward runs the module path, whose rows are not bit-independent (the attention's
# products on MLX's matmul: ~1e-6 apart between a 6-row verify and 1-row forwards of this
# model); int8 activations would turn such a difference into a flipped rounding of x, so the
# target's forward keeps x in float32 there (kernels/backend.q8_scope): still exact with them asked.
@pytest.mark.parametrize("bits,q8", [(0, False), (4, False), (4, True)])
def test_quantized_self_draft_of_a_moe_target_is_exact(tmp_path, monkeypatch, bits, q8):
    """The quantized self-draft quantizes the stacked experts too (and dequantizes a 4-bit
    target's before making its 2-bit copy); greedy output stays plain decoding's, with float
    and with int8 activations."""
    monkeypatch.setenv("EDGESPEC_Q8_ACTIVATIONS", "1" if q8 else "0")
    from mlx.utils import tree_flatten
    from mlx_lm.utils import quantize_model

    from edgespec.drafters.quantized import QuantizedDrafter

    path = make_oracle_model(tmp_path, CONFIGS["qwen3_moe"])
    if bits:
        config = json.loads((path / "config.json").read_text())
        model, config = quantize_model(load_oracle(path), config, 32, bits)
        mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
        (path / "config.json").write_text(json.dumps(config))
    target = load_target(path, dtype="auto" if bits else "float32")
    prompt = "the cat sat on the mat and then the cat sat on the mat again"
    plain = Engine(target).generate(prompt, max_tokens=24).token_ids
    drafter = QuantizedDrafter(target, 2 if bits else 8, GREEDY, 3, 3, adaptive=False,
                               group_size=32)
    draft_kinds = {type(m).__name__ for _, m in drafter.draft.model.named_modules()}
    assert "QuantizedSwitchLinear" in draft_kinds and "SwitchLinear" not in draft_kinds
    res = Engine(target, drafter).generate(prompt, max_tokens=24)
    assert res.token_ids == plain and res.stats.proposed > 0


@pytest.mark.parametrize("name, k_of_e", [("qwen3_moe", 2 / 8), ("gpt_oss", None),
                                          ("gemma4_text-moe", 2 / 4)])
def test_expert_shares_read_k_of_e_per_token(tmp_path, name, k_of_e):
    """What ``doctor`` counts a token's forward as reading of each stacked-experts module:
    k of E for one token, 1 - (1 - k/E)^n for n tokens (every family's experts say their k)."""
    from edgespec.targets.experts import expert_shares

    config = CONFIGS[name]
    target = load_target(make_oracle_model(tmp_path, config), dtype="float32")
    k_of_e = k_of_e or config["num_experts_per_tok"] / config["num_local_experts"]
    shares = expert_shares(target.model)
    assert shares and all(s == pytest.approx(k_of_e) for s in shares.values()), shares
    four = expert_shares(target.model, 4)
    assert all(s == pytest.approx(1 - (1 - k_of_e) ** 4) for s in four.values()), four


@pytest.mark.parametrize("shape,bias", [((8, 4096), False), ((32, 2880), True), ((1, 2048), False)])
def test_a_small_projection_gets_one_rows_bits_among_many(shape, bias):
    """A router (mixtral's 4096 -> 8, gpt-oss's 2880 -> 32 with a bias) or a shared expert's
    gate is under the native kernel's work threshold for one row and over it for a verify's:
    ``kernels.matmul.linear`` takes the native kernel at any work, so one row's bits are the
    same alone and among nine."""
    from edgespec.kernels import backend
    from edgespec.kernels.matmul import linear

    if not backend.native_enabled():
        pytest.skip("the native kernels do not run here")
    n, k = shape
    layer = nn.Linear(k, n, bias=bias)
    x = mx.random.normal((1, 9, k), key=mx.random.key(n))
    together = linear(layer, x)
    alone = mx.concatenate([linear(layer, x[:, i : i + 1]) for i in range(9)], axis=1)
    assert mx.array_equal(together, alone).item()
