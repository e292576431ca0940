"""The checkpoint's own MTP layer as a drafter (``--method mtp``), on tiny random Qwen3.5
checkpoints in the published layout (``mtp.fc``, ``mtp.pre_fc_norm_*``, ``mtp.layers.0.*``,
``mtp.norm``): the target loads without the layer and still matches mlx-lm, Hugging Face's norm
offsets are converted, the layer takes the target's hidden state after its final norm (checked
against the published formula on mlx-lm's own decoder layer), greedy output is plain decoding's
(alone and as an ``auto`` arm), sampled output keeps the target's distribution, and a layer built
to predict the target's own next token is accepted. What the layer gains on a real checkpoint is
not claimed here: random weights say nothing about it.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from edgespec import Engine, SamplingConfig
from edgespec.config import SpecConfig
from edgespec.drafters import registry
from edgespec.drafters.mtp import MtpDrafter
from edgespec.errors import ConfigError
from edgespec.targets import load_target
from edgespec.targets.mtp import MtpModel, has_mtp, mtp_block, mtp_target

from .oracle import CONFIGS, _random_like, load_oracle, make_oracle_model, oracle_logits
from .test_lossless import ALPHA, CFG, exact_joint, impossible, joint_pvalue, sampled_joint

pytest.importorskip("mlx_lm")

GREEDY = SamplingConfig()
QWEN = CONFIGS["qwen3_5"]  # untied, D A D A
PROMPT = "the cat sat on the mat and then the cat sat on the mat again"
_TARGET = "language_model."  # the oracle checkpoint's (mlx-lm's) prefix of the text model


def _published(name: str) -> str:
    """``MtpModel``'s parameter name -> the checkpoint's."""
    return "mtp." + name[len("model."):] if name.startswith("model.") else "mtp." + name


def _write(path, weights: dict) -> None:
    mx.save_safetensors(str(path / "model.safetensors"), weights)


def _with_mtp(path, seed: int) -> dict:
    """The checkpoint at ``path`` plus a random MTP layer in the published layout (norms around
    one, as mlx-lm's layout stores them); its head scaled by 3 (sampling then keeps a few
    dozen sequences, few enough to count). Returns the weights written."""
    weights = dict(mx.load(str(path / "model.safetensors")))
    weights[_TARGET + "lm_head.weight"] = weights[_TARGET + "lm_head.weight"] * 3
    _write(path, weights)
    target = load_target(path, dtype="float32")
    layer = MtpModel(target.args, mtp_block(target, experts=False), target.model)
    rng = np.random.default_rng(seed)
    for name, w in tree_flatten(layer.parameters()):
        weights[_published(name)] = mx.array(_random_like(name, np.array(w), rng))
    _write(path, weights)
    return weights


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = make_oracle_model(tmp_path_factory.mktemp("mtp") / "qwen", QWEN)
    _with_mtp(path, 1)
    return path


@pytest.fixture(scope="module")
def target(checkpoint):
    return load_target(checkpoint, dtype="float32")


def _bigram(path, seed: int, noise: float = 0.0):
    """A checkpoint whose every layer adds nothing (output projections zero: each position's
    hidden state is its token's embedding, so the next token depends on the current one only)
    and whose MTP layer is built to predict the target's own next token from the token it is
    given (``fc`` = [I | 0]: the embedding only; ``mtp.norm`` = the target's final norm, moved
    by ``noise`` (relative) so that its drafts are not always the target's)."""
    weights = _with_mtp(path, seed)
    zero = (".o_proj.weight", ".out_proj.weight", ".down_proj.weight")
    weights = {k: mx.zeros_like(v) if k.endswith(zero) else v for k, v in weights.items()}
    h = QWEN["hidden_size"]
    weights["mtp.fc.weight"] = mx.concatenate([mx.eye(h), mx.zeros((h, h))], axis=1)
    weights["mtp.pre_fc_norm_embedding.weight"] = mx.ones((h,))
    w = weights[_TARGET + "model.norm.weight"]
    rng = np.random.default_rng(seed)
    weights["mtp.norm.weight"] = w * mx.array(1 + noise * rng.normal(size=h).astype(np.float32))
    _write(path, weights)
    return load_target(path, dtype="float32")


def _engine(target, sampling=GREEDY, method="mtp", num_draft=3):
    spec = SpecConfig(method=method, num_draft=num_draft)
    drafter = registry.make_drafter(spec, target, sampling)
    return Engine(target, drafter, sampling)


def test_the_target_loads_without_its_mtp_layer_and_matches_mlx_lm(target, checkpoint):
    assert has_mtp(target) and "mtp.layers.0.self_attn.q_proj.weight" in target.mtp_weights
    assert not any("mtp" in k for k, _ in tree_flatten(target.model.parameters()))
    ids = [int(t) for t in np.random.default_rng(3).integers(3, 250, 20)]
    got = np.array(target.score(ids, target.make_cache()).logits)
    assert np.abs(got - oracle_logits(load_oracle(checkpoint), ids)).max() < 1e-4
    assert "mtp" in registry.heads_for(target)  # so ``auto`` and every surface offer it


def test_hugging_face_layout_keeps_the_mtp_layer_with_its_norms_converted(tmp_path, target):
    """Qwen3.5 as Hugging Face ships it (``model.language_model.*``, conv weights (C, 1, K),
    every RMSNorm an offset from one, the MTP layer's five too): the same MTP weights load."""
    path = make_oracle_model(tmp_path, QWEN)
    hf = {}
    for k, v in mx.load(str(target.path / "model.safetensors")).items():
        k = k.replace("language_model.model.", "model.language_model.").replace(
            "language_model.lm_head", "lm_head")
        if "conv1d.weight" in k:
            v = v.moveaxis(2, 1)
        elif k.endswith(("layernorm.weight", "model.language_model.norm.weight", "q_norm.weight",
                         "k_norm.weight", "mtp.norm.weight", "pre_fc_norm_embedding.weight",
                         "pre_fc_norm_hidden.weight")):
            v = v - 1.0
        hf[k] = v
    _write(path, hf)
    loaded = load_target(path, dtype="float32").mtp_weights
    assert loaded.keys() == target.mtp_weights.keys()
    for k, v in target.mtp_weights.items():
        assert np.allclose(np.array(loaded[k]), np.array(v), atol=1e-6), k


def _reference(checkpoint, target, nexts: list[int], hidden: mx.array):
    """The published MTP formula over the rows (hidden[i], nexts[i]) on mlx-lm's own Qwen3.5
    full-attention decoder layer: lm_head(norm(layer(fc([norm_e(embed); norm_h(hidden)])))),
    causal attention over the rows; (logits (rows, V), outputs after ``mtp.norm``)."""
    from mlx_lm.models.qwen3_5 import DecoderLayer, TextModelArgs

    w = target.mtp_weights
    args = TextModelArgs.from_dict({**QWEN, "vocab_size": target.args.vocab_size})
    layer = DecoderLayer(args, args.full_attention_interval - 1)
    layer.load_weights([(k[len("mtp.layers.0."):], v) for k, v in w.items()
                        if k.startswith("mtp.layers.0.")], strict=True)
    oracle = load_oracle(checkpoint).language_model

    def norm(name):
        return lambda x: mx.fast.rms_norm(x, w[f"mtp.{name}.weight"], QWEN["rms_norm_eps"])

    e = norm("pre_fc_norm_embedding")(oracle.model.embed_tokens(mx.array(nexts)))
    x = mx.concatenate([e, norm("pre_fc_norm_hidden")(hidden)], axis=-1) @ w["mtp.fc.weight"].T
    out = norm("norm")(layer(x[None], mask="causal", cache=None)[0])
    return np.array(oracle.lm_head(out)), out


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def test_the_layer_takes_the_hidden_state_after_the_final_norm(checkpoint, target):
    """The decision (``drafters/mtp.py``): the first draft's distribution is the formula's with
    the target's post-final-norm hidden state (mlx-lm's backbone output, which ends in that
    norm), not with the pre-norm one; the second draft's, with the first row's own output after
    ``mtp.norm`` (read off the q rows of a sampled chain)."""
    ids = Engine(target).encode(PROMPT)
    post = load_oracle(checkpoint).language_model.model(mx.array(ids[:-1])[None])[0]
    want, normed = _reference(checkpoint, target, ids[1:], post)
    out = target.score(ids[:-1], target.make_cache(), head=False)
    sampling = SamplingConfig(temperature=1.0, seed=0)
    drafter = MtpDrafter(target, mtp_target(target), sampling, num_draft=2, adaptive=False)
    drafter.prefill(ids, out, sampling)
    tree = drafter.propose(2)
    assert np.abs(np.array(drafter.last[1]) - want[-1]).max() < 1e-4
    assert np.abs(tree.q[0] - _softmax(want[-1])).max() < 1e-5
    pre = _reference(checkpoint, target, ids[1:], out.hidden)[0][-1]
    assert np.abs(tree.q[0] - _softmax(pre)).max() > 1e-3  # the other choice is told apart
    second, _ = _reference(checkpoint, target, ids[1:] + tree.tokens[1:2],
                           mx.concatenate([post, normed[-1:]]))
    assert np.abs(tree.q[1] - _softmax(second[-1])).max() < 1e-5


def test_greedy_output_is_plain_decoding_alone_and_in_auto(target):
    engine, auto, plain = _engine(target), _engine(target, method="auto"), Engine(target)
    assert "mtp" in auto.drafter.arms
    for prompt in (PROMPT, PROMPT + " and the dog"):  # the second reuses the first's prefix
        ids = plain.encode(prompt)
        want = plain.generate(ids, max_tokens=24).token_ids
        for e in (engine, auto):
            assert e.generate(ids, max_tokens=24).token_ids == want


def test_sampling_keeps_the_target_distribution(tmp_path):
    """``test_lossless``'s check (150 runs) on a layer that often, not always, drafts what the
    target samples."""
    target = _bigram(make_oracle_model(tmp_path, QWEN), 2, noise=0.5)
    sampling = SamplingConfig(**CFG)
    ids = Engine(target).encode(PROMPT)
    exact = exact_joint(target, ids, sampling)
    counts, proposed, accepted = sampled_joint(_engine(target, sampling, num_draft=2), ids, 150)
    assert not impossible(counts, exact) and joint_pvalue(counts, exact) > ALPHA
    assert 0 < accepted < proposed, (accepted, proposed)


def test_a_layer_that_predicts_the_targets_next_token_is_accepted(tmp_path):
    """Self-consistency: the target's next token depends on the current token only and the MTP
    layer computes exactly that from the token it is given, so its chains are accepted whole
    (the recursion, the pairs' alignment and the shared head, wired right)."""
    target = _bigram(make_oracle_model(tmp_path, QWEN), 3)
    ids = Engine(target).encode(PROMPT)
    want = Engine(target).generate(ids, max_tokens=24).token_ids
    res = _engine(target, num_draft=4).generate(ids, max_tokens=24)
    assert res.token_ids == want
    assert res.stats.proposed > 0 and res.stats.acceptance_rate == 1.0


def test_a_target_without_an_mtp_layer_is_told_what_is_missing(tmp_path):
    plain = load_target(make_oracle_model(tmp_path / "qwen", QWEN), dtype="float32")
    with pytest.raises(ConfigError, match=r"mtp\.fc\.weight.*--method"):
        registry.make_drafter(SpecConfig(method="mtp"), plain)
    assert "mtp" not in registry.heads_for(plain)
    assert "mtp" not in registry.make_drafter(SpecConfig(method="auto"), plain).arms
    llama = load_target(make_oracle_model(tmp_path / "llama", CONFIGS["llama"]), dtype="float32")
    with pytest.raises(ConfigError, match="'llama'"):
        registry.make_drafter(SpecConfig(method="mtp"), llama)


def test_the_cli_refuses_mtp_for_a_checkpoint_without_the_layer(tmp_path):
    from click.testing import CliRunner

    from edgespec.cli import main

    path = make_oracle_model(tmp_path, QWEN)
    r = CliRunner().invoke(main, ["generate", "--model", str(path), "--method", "mtp", "hi"])
    assert r.exit_code != 0 and "mtp.fc.weight" in r.output and "Traceback" not in r.output


def test_a_4_bit_mtp_layer_stays_quantized_and_drafts_losslessly(tmp_path, target, monkeypatch):
    """A checkpoint whose MTP layer is 4-bit (group 32) kept quantized: its products are
    quantized ones, its logits (float activations) those of the same weights dequantized, and
    greedy output is plain decoding's (int8 activations, the default)."""
    import json
    import shutil

    shutil.copytree(target.path, tmp_path / "q")
    path = tmp_path / "q"
    weights = dict(mx.load(str(path / "model.safetensors")))
    for k in [k for k, v in weights.items() if k.startswith("mtp.") and v.ndim == 2]:
        base = k[: -len(".weight")]
        weights[k], weights[base + ".scales"], weights[base + ".biases"] = mx.quantize(
            weights[k], group_size=32, bits=4)
    _write(path, weights)
    config = json.loads((path / "config.json").read_text())
    config["quantization"] = {"group_size": 32, "bits": 4}
    (path / "config.json").write_text(json.dumps(config))
    kept, floats = load_target(path, dtype="auto"), load_target(path, dtype="float32")
    assert isinstance(mtp_target(kept).model.fc, nn.QuantizedLinear)
    ids = Engine(kept).encode(PROMPT)
    monkeypatch.setenv("EDGESPEC_Q8_ACTIVATIONS", "0")
    firsts = []
    for t in (kept, floats):
        drafter = MtpDrafter(t, mtp_target(t), GREEDY)
        drafter.prefill(ids, t.score(ids[:-1], t.make_cache(), head=False), GREEDY)
        drafter.propose(1)
        firsts.append(np.array(drafter.last[1]))
    assert np.abs(firsts[0] - firsts[1]).max() < 1e-3
    monkeypatch.delenv("EDGESPEC_Q8_ACTIVATIONS")
    want = Engine(kept).generate(ids, max_tokens=16).token_ids
    assert _engine(kept).generate(ids, max_tokens=16).token_ids == want
