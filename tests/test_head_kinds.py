"""A head folder's kind, and whether it fits a target, from its config.json alone (``heads.kind``),
in every layout edgespec writes and in published configs without an edgespec section; and the
method table (``methods.py``) agreeing with the builders (``drafters/registry.py``) and the kinds
of head."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest

from edgespec.drafters import registry
from edgespec.errors import HeadError
from edgespec.heads import Eagle3Head, HeadConfig, MedusaHeads, save_head
from edgespec.heads.kind import KINDS, config_kind, fitting_kind
from edgespec.heads.loaded import head_kinds
from edgespec.methods import METHODS, NAMES

LAYOUTS = [("eagle3", "edgespec"), ("eagle3", "eagle"), ("eagle3", "speculators"),
           ("medusa", "edgespec"), ("medusa", "medusa")]


def _saved(tmp_path, target, kind: str, layout: str):
    """A random ``kind`` head for ``target`` saved in ``layout``, its weight files then removed
    (so a check that reads them, or builds the network from them, fails)."""
    config = HeadConfig.for_target(target, kind, num_heads=2)
    module = Eagle3Head(config) if kind == "eagle3" else MedusaHeads(config)
    mx.eval(module.parameters())
    path = save_head(tmp_path / f"{kind}-{layout}", config, module, layout=layout)
    for weights in path.glob("*.safetensors"):
        weights.unlink()
    return path


@pytest.mark.parametrize("kind,layout", LAYOUTS)
def test_the_kind_and_fit_come_from_the_config_alone(tmp_path, target, other, kind, layout):
    path = _saved(tmp_path, target, kind, layout)
    assert config_kind(path) == kind
    assert fitting_kind(path, target) == kind
    assert head_kinds(target, str(path)) == {kind}
    assert registry.heads_for(target, str(path)) == {kind}
    with pytest.raises(HeadError, match="fingerprint"):  # the same shapes, other weights
        fitting_kind(path, other)


def _published(tmp_path, cfg: dict):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_a_published_config_without_an_edgespec_section(tmp_path, target):
    H, V = target.args.hidden_size, target.args.vocab_size
    aux = {"eagle_aux_hidden_state_layer_ids": [0, 1]}
    eagle = _published(tmp_path / "e", {"architectures": ["LlamaForCausalLMEagle3"],
                                        "hidden_size": H, "vocab_size": V, "eagle_config": aux})
    assert fitting_kind(eagle, target) == "eagle3"
    wide = _published(tmp_path / "w", {"speculators_model_type": "eagle3",
                                       "transformer_layer_config": {"hidden_size": H * 2,
                                                                    "vocab_size": V}})
    with pytest.raises(HeadError, match=f"hidden size {H * 2}, but .* hidden size {H}"):
        fitting_kind(wide, target)
    deep = _published(tmp_path / "d", {"hidden_size": H, "vocab_size": V,
                                       "eagle_aux_hidden_state_layer_ids": [0, 99]})
    with pytest.raises(HeadError, match=r"features entering layers \[99\]"):
        fitting_kind(deep, target)
    bare = _published(tmp_path / "b", {"architectures": ["LlamaForCausalLMEagle3"]})
    with pytest.raises(HeadError, match="lacks hidden_size"):
        fitting_kind(bare, target)
    medusa = _published(tmp_path / "m", {"medusa_num_heads": 3, "medusa_num_layers": 1})
    assert fitting_kind(medusa, target) == "medusa"  # no sizes stated: checked when loaded


def test_a_config_that_is_no_head_is_named(tmp_path, target):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(HeadError, match="cannot be read as a head config"):
        config_kind(broken)
    odd = _published(tmp_path / "odd", {"edgespec": {"kind": "hydra"}})
    with pytest.raises(HeadError, match="head kind 'hydra' .* known: eagle3, medusa, corpus"):
        fitting_kind(odd, target)
    listed = _published(tmp_path / "list", [1, 2])
    with pytest.raises(HeadError, match="holds list, not a JSON object"):
        config_kind(listed)


def test_the_head_kinds_are_the_methods_that_need_a_head():
    assert set(KINDS) == {m.name for m in METHODS if m.needs_head}


def test_every_method_has_a_builder_and_every_arm_an_arm_builder():
    assert list(registry.BUILDERS) == list(NAMES)
    assert set(registry.ARMS) == {m.name for m in METHODS if m.arm}
    assert all(callable(b) for b in [*registry.BUILDERS.values(), *registry.ARMS.values()])
