"""Head checkpoints on disk: edgespec's own layout and the published ones, both ways.

``save_head(dir, config, module, recipe, layout=...)`` writes one of:

- ``"edgespec"`` (default): ``config.json`` = ``{"edgespec": HeadConfig}``, ``head.safetensors``
  (the module's parameter names; EAGLE-3 adds ``d2t``/``t2d``, Medusa heads with a draft
  vocabulary ``draft_ids``), optional ``recipe.json``;
- ``"eagle"``: EAGLE-3 as the EAGLE reference / SpecForge write it and vLLM / SGLang read it:
  ``model.safetensors`` with ``midlayer.*``, ``fc.weight``, ``norm.weight``, ``lm_head.weight``,
  ``d2t`` (int64 offsets: target = draft + d2t[draft]), ``t2d`` (bool over the target vocabulary);
  ``config.json`` in LlamaForCausalLMEagle3 style (``draft_vocab_size``,
  ``eagle_config.eagle_aux_hidden_state_layer_ids``);
- ``"speculators"``: the same tensors as ``layers.0.*``, config in speculators' style
  (``speculators_model_type``, ``transformer_layer_config``, ``eagle_aux_hidden_state_layer_ids``);
- ``"medusa"``: ``medusa_lm_head.safetensors`` with ``{h}.{l}.linear.weight|bias`` and
  ``{h}.{L}.weight`` (head h's LM head after its L blocks), config ``medusa_num_heads``,
  ``medusa_num_layers``. That layout has no draft vocabulary: heads exported with one draft from
  the whole vocabulary when read back (the LM head rows are the target's either way).

Every written config.json also carries the ``edgespec`` section (other readers ignore it), so the
target fingerprint survives an export. ``load_head(dir)`` reads all four (an optional ``model.``
prefix on EAGLE-3 keys too) and, given the target, checks the head fits it. Floats are stored
as float16 and loaded as float32 unless asked otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from ..errors import HeadError
from .config import HeadConfig
from .eagle3 import Eagle3Head
from .medusa import MedusaHeads

LAYOUTS = ("edgespec", "eagle", "speculators", "medusa")
_OURS, _MEDUSA = "head.safetensors", "medusa_lm_head.safetensors"
_LAYER_PREFIX = {"eagle": "midlayer.", "speculators": "layers.0."}


def save_head(path, config: HeadConfig, module, recipe: dict | None = None,
              dtype=mx.float16, layout: str = "edgespec", shared_head: mx.array | None = None) -> Path:
    """Write ``module`` (an Eagle3Head or MedusaHeads) to the directory ``path`` in ``layout``.

    ``shared_head``: the target's LM head (V, H), needed only to export Medusa heads that share
    it into the Medusa layout (whose readers expect an LM head per head).
    """
    if layout not in LAYOUTS:
        raise HeadError(f"head layout {layout!r} is not known; known: {', '.join(LAYOUTS)}")
    wants = "medusa" if layout == "medusa" else "eagle3" if layout in _LAYER_PREFIX else config.kind
    if wants != config.kind:
        raise HeadError(f"a {config.kind} head cannot be written in the {layout!r} layout")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    ours = {"edgespec": {**config.to_dict(), "layout": layout}}
    params = {k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v
              for k, v in tree_flatten(module.parameters())}
    if layout == "edgespec":
        weights, file, cfg = params, _OURS, ours
        if config.kind == "eagle3":
            weights.update(_vocab_maps(module))
        elif module.draft_ids is not None:
            weights["draft_ids"] = mx.array(module.draft_ids.astype(np.int32))
    elif layout == "medusa":
        weights, file = _to_medusa(config, params, shared_head, dtype), _MEDUSA
        cfg = {"medusa_num_heads": config.num_heads, "medusa_num_layers": config.num_layers,
               "hidden_size": config.hidden_size, "vocab_size": config.vocab_size,
               "base_model_name_or_path": config.target_name, **ours}
    else:
        prefix = _LAYER_PREFIX[layout]
        weights = {(prefix + k[len("layer."):] if k.startswith("layer.") else k): v
                   for k, v in params.items()}
        weights.update(_vocab_maps(module))
        file, cfg = "model.safetensors", {**_eagle_config(config, layout), **ours}
    for stale in (_OURS, _MEDUSA, "model.safetensors"):  # another layout's weights, left here
        if stale != file and (path / stale).is_file():   # by an earlier save, would be read first
            (path / stale).unlink()
    mx.save_safetensors(str(path / file), weights)
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    if recipe is not None:
        (path / "recipe.json").write_text(json.dumps(recipe, indent=1))
    return path


def _vocab_maps(head: Eagle3Head) -> dict[str, mx.array]:
    return {"d2t": head.d2t.astype(mx.int64), "t2d": head.t2d}


def _to_medusa(c: HeadConfig, params: dict, shared_head, dtype) -> dict[str, mx.array]:
    out = {}
    for k, v in params.items():  # heads.{h}.blocks.{l}.linear.* | heads.{h}.lm_head.weight
        parts = k.split(".")
        h = parts[1]
        out[f"{h}.{parts[3]}.linear.{parts[-1]}" if parts[2] == "blocks" else
            f"{h}.{c.num_layers}.weight"] = v
    if not c.own_lm_head:
        if shared_head is None:
            raise HeadError("these Medusa heads share the target's LM head; the Medusa layout "
                            "needs one per head: pass shared_head (the target's (V, H) head)")
        for h in range(c.num_heads):
            out[f"{h}.{c.num_layers}.weight"] = shared_head.astype(dtype)
    return out


def _layer_config(c: HeadConfig) -> dict:
    return {"model_type": "llama", "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
            "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
            "rope_scaling": c.rope_scaling, "vocab_size": c.vocab_size, "hidden_act": "silu",
            "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False}


def _eagle_config(c: HeadConfig, layout: str) -> dict:
    aux = list(c.aux_layers)
    if layout == "eagle":
        return {"architectures": ["LlamaForCausalLMEagle3"], **_layer_config(c),
                "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.hidden_size,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux,
                                 "use_aux_hidden_state": True}}
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "transformer_layer_config": _layer_config(c), "draft_vocab_size": c.draft_vocab_size,
            "norm_before_residual": False, "target_hidden_size": c.hidden_size,
            "eagle_aux_hidden_state_layer_ids": aux,
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy",
                                                         "speculative_tokens": 5}],
                                   "verifier": {"name_or_path": c.target_name,
                                                "architectures": ["LlamaForCausalLM"]}}}


# -- reading


def load_head(path, target=None, dtype=mx.float32):
    """Read a head directory in any layout -> (HeadConfig, Eagle3Head | MedusaHeads).

    With ``target``, fill in the default aux layers when the checkpoint names none and check
    that the head fits it (HeadError naming both values otherwise).
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        raise HeadError(f"{path} is not a head directory: it has no config.json")
    cfg = json.loads((path / "config.json").read_text())
    if (path / _OURS).is_file():
        config = HeadConfig.from_dict(_ours(cfg, path))
        weights = _read(path / _OURS)
        if config.kind == "medusa":
            module = _medusa_module(config, weights, path)
        else:
            module = _eagle_module(config, weights, path)
    elif (path / _MEDUSA).is_file():
        config, module = _read_medusa(cfg, _read(path / _MEDUSA), path)
    else:
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise HeadError(f"{path} has no .safetensors weights ({_OURS}, {_MEDUSA} or an "
                            f"EAGLE-3 checkpoint's)")
        weights = {k: v for f in files for k, v in _read(f).items()}
        config, module = _read_eagle(cfg, weights, path)
    if target is not None:
        config = config.for_layers(target.num_layers)
        module.config = config
        config.check(target)
    module.apply(lambda a: a.astype(dtype) if mx.issubdtype(a.dtype, mx.floating) else a)
    return config, module


def _read(file: Path) -> dict[str, mx.array]:
    try:
        return mx.load(str(file))
    except Exception as e:  # a truncated or foreign file: say which
        raise HeadError(f"cannot read head weights {file}: {e}") from e


def _ours(cfg: dict, path: Path) -> dict:
    if "edgespec" not in cfg:
        raise HeadError(f"{path}/config.json has no 'edgespec' section next to {_OURS}")
    return cfg["edgespec"]


def _build(module, weights: dict[str, mx.array], path: Path):
    """Load ``weights`` into ``module``, naming missing, extra or misshapen tensors."""
    expected = dict(tree_flatten(module.parameters()))
    missing, extra = sorted(expected.keys() - weights.keys()), sorted(weights.keys() - expected.keys())
    if missing or extra:
        raise HeadError(f"{path}: weights do not match the head's config: missing {missing[:6]}, "
                        f"unexpected {extra[:6]}")
    for k, v in expected.items():
        if weights[k].shape != v.shape:
            raise HeadError(f"{path}: {k} has shape {tuple(weights[k].shape)}, the config "
                            f"implies {tuple(v.shape)}")
    module.load_weights(list(weights.items()))
    return module


def _medusa_module(config: HeadConfig, weights: dict[str, mx.array], path: Path) -> MedusaHeads:
    ids = weights.pop("draft_ids", None)
    heads = _build(MedusaHeads(config), weights, path)
    if config.draft_vocab_size and ids is None:
        raise HeadError(f"{path}: a draft vocabulary of {config.draft_vocab_size} but no "
                        "draft_ids in its weights")
    if ids is not None:
        heads.set_draft_vocab(np.array(ids))
    return heads


def _eagle_module(config: HeadConfig, weights: dict[str, mx.array], path: Path) -> Eagle3Head:
    d2t, t2d = weights.pop("d2t", None), weights.pop("t2d", None)
    head = _build(Eagle3Head(config), weights, path)
    Vd = config.draft_vocab_size
    if d2t is None:
        if Vd != config.vocab_size:
            raise HeadError(f"{path}: no d2t map for a draft vocabulary of {Vd} < {config.vocab_size}")
        return head
    ids = np.arange(Vd) + np.array(d2t).astype(np.int64)
    try:
        head.set_draft_vocab(ids)
    except ValueError as e:
        raise HeadError(f"{path}: d2t does not map {Vd} draft ids to distinct target ids: {e}") from e
    if t2d is not None and not np.array_equal(np.array(head.t2d), np.array(t2d).astype(bool)):
        raise HeadError(f"{path}: t2d marks {int(np.array(t2d).sum())} target ids, which are not "
                        f"the {Vd} that d2t maps to")
    return head


def _read_eagle(cfg: dict, weights: dict[str, mx.array], path: Path):
    weights = {k[len("model."):] if k.startswith("model.") else k: v for k, v in weights.items()}
    weights.pop("embed_tokens.weight", None)  # the target's own embedding, if a writer kept it
    if any(k.startswith("layers.1.") for k in weights):
        raise HeadError(f"{path}: an EAGLE-3 head with more than one decoder layer is not supported")
    renamed = {}
    for k, v in weights.items():
        for prefix in ("midlayer.", "layers.0."):
            if k.startswith(prefix):
                k = "layer." + k[len(prefix):]
        renamed[k] = v
    if "fc.weight" not in renamed:
        raise HeadError(f"{path}: no fc.weight: not an EAGLE-3 checkpoint (keys: {sorted(renamed)[:6]})")
    layer = cfg.get("transformer_layer_config", cfg)
    if cfg.get("norm_before_residual"):
        raise HeadError(f"{path}: norm_before_residual=true heads are not supported (false is)")
    ours = cfg.get("edgespec", {})
    H = int(layer["hidden_size"])
    target_h = cfg.get("target_hidden_size") or layer.get("target_hidden_size")
    if target_h is not None and int(target_h) != H:
        raise HeadError(f"{path}: a head of hidden size {H} over a target of hidden size "
                        f"{target_h} is not supported (only heads as wide as their target)")
    aux = (cfg.get("eagle_aux_hidden_state_layer_ids")
           or (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"))
    if aux is None:
        n_aux = renamed["fc.weight"].shape[1] // H
        aux = () if n_aux == 3 else None
        if aux is None:
            raise HeadError(f"{path}: fc takes {n_aux} features but the config names no aux layers")
    heads = int(layer["num_attention_heads"])
    config = HeadConfig(
        kind="eagle3", hidden_size=H, vocab_size=int(layer["vocab_size"]),
        draft_vocab_size=int(cfg.get("draft_vocab_size") or layer["vocab_size"]),
        aux_layers=tuple(aux), num_attention_heads=heads,
        num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
        head_dim=int(layer.get("head_dim") or H // heads),
        intermediate_size=int(layer["intermediate_size"]),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-5)),
        rope_theta=float(layer.get("rope_theta", 10000.0)), rope_scaling=layer.get("rope_scaling"),
        target_layers=ours.get("target_layers"), target_fingerprint=ours.get("target_fingerprint"),
        target_name=ours.get("target_name"))
    return config, _eagle_module(config, renamed, path)


def _read_medusa(cfg: dict, weights: dict[str, mx.array], path: Path):
    weights = {k[len("medusa_head."):] if k.startswith("medusa_head.") else k: v
               for k, v in weights.items()}
    try:
        K, L = int(cfg["medusa_num_heads"]), int(cfg["medusa_num_layers"])
    except KeyError as e:
        raise HeadError(f"{path}/config.json lacks {e.args[0]} (a Medusa config has "
                        f"medusa_num_heads and medusa_num_layers)") from None
    if "0.0.linear.weight" not in weights:
        raise HeadError(f"{path}: no '0.0.linear.weight' in {_MEDUSA} (keys: {sorted(weights)[:6]})")
    H = weights["0.0.linear.weight"].shape[0]
    own = f"0.{L}.weight" in weights
    V = weights[f"0.{L}.weight"].shape[0] if own else int(cfg.get("vocab_size", 0))
    ours = cfg.get("edgespec", {})
    config = HeadConfig(kind="medusa", hidden_size=H, vocab_size=V, num_heads=K, num_layers=L,
                        own_lm_head=own, target_layers=ours.get("target_layers"),
                        target_fingerprint=ours.get("target_fingerprint"),
                        target_name=ours.get("target_name") or cfg.get("base_model_name_or_path"))
    renamed = {}
    for k, v in weights.items():
        parts = k.split(".")
        if len(parts) == 4 and parts[2] == "linear":
            renamed[f"heads.{parts[0]}.blocks.{parts[1]}.linear.{parts[3]}"] = v
        elif len(parts) == 3 and parts[1] == str(L):
            renamed[f"heads.{parts[0]}.lm_head.weight"] = v
        else:
            renamed[k] = v  # named as unexpected by _build
    return config, _build(MedusaHeads(config), renamed, path)
