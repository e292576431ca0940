"""Head checkpoints both ways: files written here by hand (safetensors.numpy + json, the key
names and config fields the EAGLE reference / SpecForge / vLLM, speculators and Medusa use) load
into heads that compute what a numpy forward of the published math computes; our exports hold
the published names and the same math; every layout round-trips; a head refuses a target it
was not trained for, and a broken checkpoint is named."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from edgespec.errors import HeadError
from edgespec.heads import Eagle3Head, HeadConfig, MedusaHeads, load_head, save_head

LAYERS, VD, INTER = 4, 40, 96
rng = np.random.default_rng(0)


@pytest.fixture(scope="module")
def deep(tiny_models):
    return tiny_models.load(layers=LAYERS)


# -- the published math, in numpy


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, pos, theta):  # (N, heads, D), rotate-half form
    D = x.shape[-1]
    ang = pos[:, None] * theta ** (-np.arange(0, D, 2) / D)
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    a, b = x[..., : D // 2], x[..., D // 2 :]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def _silu(x):
    return x / (1 + np.exp(-x))


def np_eagle3(t: dict, cfg: dict, feats: np.ndarray, emb: np.ndarray) -> np.ndarray:
    """Draft logits of a chain of rows at positions 0..N-1 (causal), ``t`` keyed as
    ``layer.*``, ``fc.weight``, ``norm.weight``, ``lm_head.weight`` (float64)."""
    N, eps, theta = len(emb), cfg["rms_norm_eps"], cfg["rope_theta"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // nh
    h = feats @ t["fc.weight"].T
    x = np.concatenate([_rms(emb, t["layer.input_layernorm.weight"], eps),
                        _rms(h, t["layer.hidden_norm.weight"], eps)], axis=-1)
    pos = np.arange(N)
    q = _rope((x @ t["layer.self_attn.q_proj.weight"].T).reshape(N, nh, D), pos, theta)
    k = _rope((x @ t["layer.self_attn.k_proj.weight"].T).reshape(N, nkv, D), pos, theta)
    v = (x @ t["layer.self_attn.v_proj.weight"].T).reshape(N, nkv, D)
    out = np.zeros((N, nh, D))
    for i in range(nh):
        s = q[:, i] @ k[:, i // (nh // nkv)].T / np.sqrt(D)
        s = np.where(np.tril(np.ones((N, N), bool)), s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        out[:, i] = (w / w.sum(-1, keepdims=True)) @ v[:, i // (nh // nkv)]
    r = h + out.reshape(N, -1) @ t["layer.self_attn.o_proj.weight"].T
    m = _rms(r, t["layer.post_attention_layernorm.weight"], eps)
    mlp = (_silu(m @ t["layer.mlp.gate_proj.weight"].T) * (m @ t["layer.mlp.up_proj.weight"].T))
    r = r + mlp @ t["layer.mlp.down_proj.weight"].T
    return _rms(r, t["norm.weight"], eps) @ t["lm_head.weight"].T


def _canonical(tensors: dict) -> dict:
    """A published EAGLE-3 checkpoint's tensors keyed as np_eagle3 reads them, as float64."""
    out = {}
    for k, v in tensors.items():
        k = k.removeprefix("model.")
        for prefix in ("midlayer.", "layers.0."):
            if k.startswith(prefix):
                k = "layer." + k[len(prefix):]
        out[k] = v.astype(np.float64) if v.dtype.kind == "f" else v
    return out


def _inputs(target, aux, N=7):
    x = rng.integers(3, target.args.vocab_size, N + 1).tolist()
    out = target.score(x[:N], target.make_cache(), capture=aux)
    feats = mx.concatenate([out.captured[i] for i in aux], axis=-1)
    return feats, target.model.embed(mx.array(x[1:])[None])[0]


def _run(head: Eagle3Head, feats, emb) -> np.ndarray:
    from edgespec.tree import chain_mask

    n = emb.shape[0]
    logits, _ = head.step(emb, head.fuse(feats), 0, chain_mask(n, np.arange(0), 0, None),
                          head.make_cache())
    return np.array(logits)


# -- an independent writer of the published EAGLE-3 layouts


def _layer_config(V: int) -> dict:
    return {"hidden_size": 64, "intermediate_size": INTER, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
            "rope_theta": 5000.0, "vocab_size": V, "num_hidden_layers": 1,
            "hidden_act": "silu", "model_type": "llama"}


def _write_eagle3(path, layout: str, V: int, aux=(1, 2, 3), prefix: str = "") -> dict:
    H = 64
    layer = "midlayer." if layout == "eagle" else "layers.0."
    shapes = {"fc.weight": (H, 3 * H), "norm.weight": (H,), "lm_head.weight": (VD, H),
              layer + "self_attn.q_proj.weight": (64, 2 * H),
              layer + "self_attn.k_proj.weight": (32, 2 * H),
              layer + "self_attn.v_proj.weight": (32, 2 * H),
              layer + "self_attn.o_proj.weight": (H, 64),
              layer + "mlp.gate_proj.weight": (INTER, H), layer + "mlp.up_proj.weight": (INTER, H),
              layer + "mlp.down_proj.weight": (H, INTER),
              layer + "input_layernorm.weight": (H,), layer + "hidden_norm.weight": (H,),
              layer + "post_attention_layernorm.weight": (H,)}
    t = {prefix + k: (rng.normal(0, 1 / np.sqrt(s[-1]), s) if len(s) == 2
                      else 1 + 0.1 * rng.normal(size=s)).astype(np.float16)
         for k, s in shapes.items()}
    ids = np.sort(rng.choice(np.arange(3, V), VD, replace=False))
    t["d2t"] = (ids - np.arange(VD)).astype(np.int64)
    t2d = np.zeros(V, dtype=bool)
    t2d[ids] = True
    t["t2d"] = t2d
    if layout == "speculators":
        t["embed_tokens.weight"] = rng.normal(size=(V, H)).astype(np.float16)  # ignored
        cfg = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
               "transformer_layer_config": _layer_config(V), "draft_vocab_size": VD,
               "norm_before_residual": False, "eagle_aux_hidden_state_layer_ids": list(aux)}
    else:
        cfg = {"architectures": ["LlamaForCausalLMEagle3"], **_layer_config(V),
               "draft_vocab_size": VD, "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux)}}
    path.mkdir()
    save_file(t, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    return {"tensors": t, "ids": ids, "cfg": cfg.get("transformer_layer_config", cfg)}


@pytest.mark.parametrize("layout,prefix", [("eagle", ""), ("eagle", "model."),
                                           ("speculators", "")])
def test_published_eagle3_loads_and_computes_the_published_math(deep, tmp_path, layout, prefix):
    w = _write_eagle3(tmp_path / "ck", layout, deep.args.vocab_size, prefix=prefix)
    config, head = load_head(tmp_path / "ck", deep)
    assert (config.aux_layers, config.draft_vocab_size, config.intermediate_size) == ((1, 2, 3), VD, INTER)
    assert config.target_fingerprint is None  # published heads carry none: shapes are checked
    feats, emb = _inputs(deep, config.aux_layers)
    expected = np_eagle3(_canonical(w["tensors"]), w["cfg"], np.array(feats, np.float64),
                         np.array(emb, np.float64))
    got = _run(head, feats, emb)
    np.testing.assert_allclose(got, expected, atol=2e-4, rtol=1e-3)
    draft = got.argmax(-1)
    assert np.array_equal(np.array(head.to_target_ids(draft)), w["ids"][draft])


def test_published_eagle3_without_aux_ids_takes_the_targets_defaults(deep, tmp_path):
    _write_eagle3(tmp_path / "ck", "eagle", deep.args.vocab_size)
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    del cfg["eagle_config"]
    (tmp_path / "ck" / "config.json").write_text(json.dumps(cfg))
    assert load_head(tmp_path / "ck")[0].aux_layers == ()
    assert load_head(tmp_path / "ck", deep)[0].aux_layers == (2, 2, 1)  # (2, L//2, L-3), L=4


# -- our exports, read by hand


def _trained_like(deep) -> Eagle3Head:
    mx.random.seed(3)
    head = Eagle3Head(HeadConfig.for_target(deep, "eagle3", draft_vocab_size=VD))
    head.set_draft_vocab(rng.permutation(np.arange(3, deep.args.vocab_size))[:VD])
    mx.eval(head.parameters())
    return head


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
def test_eagle3_export_holds_the_published_names_and_math(deep, tmp_path, layout):
    head = _trained_like(deep)
    save_head(tmp_path / "out", head.config, head, recipe={"steps": 1}, layout=layout)
    t = load_file(str(tmp_path / "out" / "model.safetensors"))
    layer = "midlayer." if layout == "eagle" else "layers.0."
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
            layer + "self_attn.q_proj.weight", layer + "hidden_norm.weight"} <= set(t)
    assert t["fc.weight"].dtype == np.float16 and t["d2t"].dtype == np.int64
    assert t["t2d"].dtype == bool and t["t2d"].sum() == VD
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    layer_cfg = cfg.get("transformer_layer_config", cfg)
    aux = (cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] if layout == "eagle"
           else cfg["eagle_aux_hidden_state_layer_ids"])
    assert (cfg["draft_vocab_size"], aux) == (VD, list(head.config.aux_layers))
    assert cfg["edgespec"]["target_fingerprint"] == head.config.target_fingerprint
    assert json.loads((tmp_path / "out" / "recipe.json").read_text()) == {"steps": 1}
    feats, emb = _inputs(deep, head.config.aux_layers)
    expected = np_eagle3(_canonical(t), layer_cfg, np.array(feats, np.float64),
                         np.array(emb, np.float64))
    np.testing.assert_allclose(_run(head, feats, emb), expected, atol=2e-2, rtol=2e-2)  # float16
    ids = np.arange(VD) + t["d2t"]
    assert np.array_equal(ids, np.array(head.to_target_ids(np.arange(VD))))


@pytest.mark.parametrize("layout", ["edgespec", "eagle", "speculators"])
def test_eagle3_round_trip(deep, tmp_path, layout):
    head = _trained_like(deep)
    save_head(tmp_path / "h", head.config, head, layout=layout, dtype=mx.float32)
    config, back = load_head(tmp_path / "h", deep)
    assert config == head.config
    feats, emb = _inputs(deep, config.aux_layers)
    np.testing.assert_array_equal(_run(back, feats, emb), _run(head, feats, emb))
    assert np.array_equal(np.array(back.d2t), np.array(head.d2t))


# -- Medusa


def _write_medusa(path, V: int, K=3, L=2) -> dict:
    H = 64
    t = {}
    for h in range(K):
        for l in range(L):
            t[f"{h}.{l}.linear.weight"] = rng.normal(0, 0.2, (H, H)).astype(np.float16)
            t[f"{h}.{l}.linear.bias"] = rng.normal(0, 0.2, (H,)).astype(np.float16)
        t[f"{h}.{L}.weight"] = rng.normal(0, 0.2, (V, H)).astype(np.float16)
    path.mkdir()
    save_file(t, str(path / "medusa_lm_head.safetensors"))
    (path / "config.json").write_text(json.dumps(
        {"medusa_num_heads": K, "medusa_num_layers": L, "base_model_name_or_path": "tiny"}))
    return t


def np_medusa(t: dict, x: np.ndarray, K: int, L: int) -> np.ndarray:
    out = []
    for h in range(K):
        y = x
        for l in range(L):
            y = y + _silu(y @ t[f"{h}.{l}.linear.weight"].T.astype(np.float64)
                          + t[f"{h}.{l}.linear.bias"].astype(np.float64))
        out.append(y @ t[f"{h}.{L}.weight"].T.astype(np.float64))
    return np.stack(out)


def test_published_medusa_loads_and_computes_the_published_math(deep, tmp_path):
    t = _write_medusa(tmp_path / "m", deep.args.vocab_size)
    config, heads = load_head(tmp_path / "m", deep)
    assert (config.kind, config.num_heads, config.num_layers, config.own_lm_head) == ("medusa", 3, 2, True)
    x = rng.normal(size=(5, 64)).astype(np.float32)
    np.testing.assert_allclose(np.array(heads(mx.array(x))), np_medusa(t, x, 3, 2),
                               atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("own", [True, False])
def test_medusa_export_and_round_trip(deep, tmp_path, own):
    from edgespec.heads.medusa import target_lm_head, target_lm_head_weight

    c = HeadConfig.for_target(deep, "medusa", num_heads=2, num_layers=1, own_lm_head=own)
    heads = MedusaHeads(c)
    heads.init_from_target(deep)
    for head in heads.heads:  # something other than the identity
        head.blocks[0].linear.weight = mx.array(rng.normal(0, 0.2, (64, 64)).astype(np.float32))
    lm = target_lm_head(deep)
    x = mx.array(rng.normal(size=(4, 64)).astype(np.float32))
    save_head(tmp_path / "ours", c, heads, dtype=mx.float32)
    back_c, back = load_head(tmp_path / "ours", deep)
    assert back_c == c
    np.testing.assert_array_equal(np.array(back(x, lm)), np.array(heads(x, lm)))
    if not own:
        with pytest.raises(HeadError, match="shared_head"):
            save_head(tmp_path / "pub", c, heads, layout="medusa")
    save_head(tmp_path / "pub", c, heads, layout="medusa",
              shared_head=None if own else target_lm_head_weight(deep))
    t = load_file(str(tmp_path / "pub" / "medusa_lm_head.safetensors"))
    assert set(t) == {"0.0.linear.weight", "0.0.linear.bias", "0.1.weight",
                      "1.0.linear.weight", "1.0.linear.bias", "1.1.weight"}
    cfg = json.loads((tmp_path / "pub" / "config.json").read_text())
    assert (cfg["medusa_num_heads"], cfg["medusa_num_layers"]) == (2, 1)
    np.testing.assert_allclose(np_medusa(t, np.array(x, np.float64), 2, 1),
                               np.array(heads(x, lm)), atol=3e-2, rtol=3e-2)  # float16 file



def test_a_medusa_draft_vocabulary_round_trips_and_is_required_when_named(deep, tmp_path):
    """``draft_ids`` travels in head.safetensors; a config naming a draft vocabulary whose
    weights lack it is refused; the published Medusa layout drops it (whole vocabulary)."""
    from edgespec.heads.medusa import target_lm_head_weight

    ids = np.arange(1, deep.args.vocab_size, 2)
    c = HeadConfig.for_target(deep, "medusa", num_heads=2, num_layers=1, own_lm_head=False,
                              draft_vocab_size=len(ids))
    heads = MedusaHeads(c)
    heads.set_draft_vocab(ids)
    save_head(tmp_path / "ours", c, heads)
    back_c, back = load_head(tmp_path / "ours", deep)
    assert back_c == c and np.array_equal(back.draft_ids, ids)
    weights = load_file(str(tmp_path / "ours" / "head.safetensors"))
    del weights["draft_ids"]
    save_file(weights, str(tmp_path / "ours" / "head.safetensors"))
    with pytest.raises(HeadError, match=f"draft vocabulary of {len(ids)} but no draft_ids"):
        load_head(tmp_path / "ours", deep)
    save_head(tmp_path / "pub", c, heads, layout="medusa", shared_head=target_lm_head_weight(deep))
    pub_c, pub = load_head(tmp_path / "pub", deep)
    assert pub.draft_ids is None and pub_c.draft_vocab_size == 0


# -- refusals and broken checkpoints


def test_a_head_refuses_a_target_it_was_not_trained_for(deep, tiny_models, tmp_path):
    head = _trained_like(deep)
    save_head(tmp_path / "h", head.config, head)
    wide = tiny_models.load(layers=LAYERS, hidden=32, heads=2, kv_heads=1, intermediate=64)
    with pytest.raises(HeadError, match="hidden size 64, but .* has hidden size 32"):
        load_head(tmp_path / "h", wide)
    other = tiny_models.load(layers=LAYERS, seed=7)
    with pytest.raises(HeadError, match=f"fingerprint {head.config.target_fingerprint}"):
        load_head(tmp_path / "h", other)
    bigger = tiny_models.load(layers=LAYERS, extra_tokens=("xyz",))
    _write_eagle3(tmp_path / "pub", "eagle", deep.args.vocab_size)  # no fingerprint: the shapes
    with pytest.raises(HeadError, match=f"vocabulary size {deep.args.vocab_size}, but .* "
                                        f"{bigger.args.vocab_size}"):
        load_head(tmp_path / "pub", bigger)


def test_broken_checkpoints_are_named(deep, tmp_path):
    with pytest.raises(HeadError, match="no config.json"):
        load_head(tmp_path)
    w = _write_eagle3(tmp_path / "a", "eagle", deep.args.vocab_size)
    t = dict(w["tensors"])
    t["midlayer.mlp.up_proj.weight"] = t["midlayer.mlp.up_proj.weight"][:10]
    save_file(t, str(tmp_path / "a" / "model.safetensors"))
    with pytest.raises(HeadError, match=r"layer.mlp.up_proj.weight has shape \(10, 64\).*\(96, 64\)"):
        load_head(tmp_path / "a")
    del t["midlayer.mlp.up_proj.weight"]
    save_file(t, str(tmp_path / "a" / "model.safetensors"))
    with pytest.raises(HeadError, match="missing.*up_proj"):
        load_head(tmp_path / "a")
    w = _write_eagle3(tmp_path / "b", "eagle", deep.args.vocab_size)
    t = dict(w["tensors"])
    t["d2t"] = np.zeros(VD, dtype=np.int64)  # every draft id onto the first target ids...
    save_file(t, str(tmp_path / "b" / "model.safetensors"))
    with pytest.raises(HeadError, match="t2d marks"):  # ...which t2d does not mark
        load_head(tmp_path / "b")
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    (tmp_path / "b" / "config.json").write_text(json.dumps({**cfg, "norm_before_residual": True}))
    with pytest.raises(HeadError, match="norm_before_residual"):
        load_head(tmp_path / "b")
    (tmp_path / "b" / "config.json").write_text(json.dumps({**cfg, "target_hidden_size": 128}))
    with pytest.raises(HeadError, match="hidden size 64 over a target of hidden size 128"):
        load_head(tmp_path / "b")


def test_saving_over_another_layout_leaves_only_the_new_weights(deep, tmp_path):
    head = _trained_like(deep)
    save_head(tmp_path / "h", head.config, head)  # head.safetensors
    save_head(tmp_path / "h", head.config, head, layout="speculators")
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((tmp_path / "h" / "config.json").read_text())["edgespec"]["layout"] == "speculators"
    assert load_head(tmp_path / "h", deep)[0] == head.config
