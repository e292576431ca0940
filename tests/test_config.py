"""The config dataclasses: every validation rule (a bad value -> ConfigError naming the value and
what is allowed), their normalisations, and the method registry they validate against."""

from __future__ import annotations

import dataclasses

import pytest

from edgespec.config import (DTYPES, MAX_DRAFT, GenerationConfig, ModelConfig, SamplingConfig,
                             SpecConfig)
from edgespec.drafters import registry
from edgespec.errors import ConfigError

# (class, keyword arguments, what the message must contain: the bad value and what is allowed)
BAD = [
    (SamplingConfig, dict(temperature=-1), ["-1", "[0, 100]"]),
    (SamplingConfig, dict(temperature=101.0), ["101.0", "[0, 100]"]),
    (SamplingConfig, dict(temperature="hot"), ["'hot'", "number"]),
    (SamplingConfig, dict(temperature=True), ["True", "number"]),
    (SamplingConfig, dict(top_k=-1), ["-1", ">= 0"]),
    (SamplingConfig, dict(top_k=2.5), ["2.5", "integer"]),
    (SamplingConfig, dict(top_p=0), ["0", "(0, 1]"]),
    (SamplingConfig, dict(top_p=1.5), ["1.5", "(0, 1]"]),
    (SamplingConfig, dict(min_p=1.0), ["1.0", "[0, 1)"]),
    (SamplingConfig, dict(min_p=-0.1), ["-0.1", "[0, 1)"]),
    (SamplingConfig, dict(seed=-1), ["-1", "[0, 2**63)"]),
    (SamplingConfig, dict(seed=2**63), [str(2**63), "[0, 2**63)"]),
    (SamplingConfig, dict(seed=1.5), ["1.5", "integer"]),
    (SamplingConfig, dict(frequency_penalty=2.5), ["frequency_penalty", "2.5", "[-2, 2]"]),
    (SamplingConfig, dict(presence_penalty="x"), ["presence_penalty", "'x'", "[-2, 2]"]),
    (SamplingConfig, dict(repetition_penalty=0), ["repetition_penalty", "0", "(0, 10]"]),
    (SpecConfig, dict(method="magic"), ["'magic'", ", ".join(registry.NAMES)]),
    (SpecConfig, dict(method=3), ["3", ", ".join(registry.NAMES)]),
    (SpecConfig, dict(num_draft=0), ["0", "[1, 64]"]),
    (SpecConfig, dict(num_draft=65), ["65", "[1, 64]"]),
    (SpecConfig, dict(num_draft=2.0), ["2.0", "integer"]),
    (SpecConfig, dict(num_draft=8, max_draft=6), ["6", "[num_draft, 64]", "num_draft is 8", "--max-draft"]),
    (SpecConfig, dict(max_draft=65), ["65", "[num_draft, 64]"]),
    (SpecConfig, dict(adaptive="yes"), ["'yes'", "true or false"]),
    (SpecConfig, dict(method="lookup", draft=""), ["''", "non-empty"]),
    (SpecConfig, dict(method="lookup", draft=5), ["5", "model reference"]),
    (SpecConfig, dict(method="draft"), ["'draft'", "needs a draft model", "--draft REF"]),
    (SpecConfig, dict(method="cascade"), ["'cascade'", "needs a draft model", "--draft REF"]),
    (SpecConfig, dict(method="early-exit", exit_layer=0), ["0", ">= 1"]),
    (SpecConfig, dict(method="early-exit", exit_layer=1.5), ["1.5", ">= 1"]),
    (SpecConfig, dict(method="lookup", exit_layer=3), ["exit_layer", "'early-exit'", "'lookup'"]),
    (SpecConfig, dict(draft_bits=5), ["5", "2, 3, 4 or 8"]),
    (SpecConfig, dict(draft_bits=4.0), ["4.0", "2, 3, 4 or 8"]),
    (SpecConfig, dict(method="eagle3", head_bits=6), ["6", "0 (float32), 4 or 8"]),
    (SpecConfig, dict(method="eagle3", head_bits=8.0), ["8.0", "0 (float32), 4 or 8"]),
    (SpecConfig, dict(method="corpus", head_bits=8), ["head_bits", "'eagle3'", "'corpus'"]),
    (GenerationConfig, dict(max_tokens=0), ["0", "[1, 1000000]"]),
    (GenerationConfig, dict(max_tokens=10**7), [str(10**7), "[1, 1000000]"]),
    (GenerationConfig, dict(max_tokens="10"), ["'10'", "integer"]),
    (GenerationConfig, dict(stop=[""]), ["('',)", "non-empty string"]),
    (GenerationConfig, dict(stop=3), ["3", "non-empty string"]),
    (GenerationConfig, dict(stop=["ok", 4]), ["4", "non-empty string"]),
    (ModelConfig, dict(model=""), ["''", "model reference"]),
    (ModelConfig, dict(dtype="int4"), ["'int4'", ", ".join(DTYPES)]),
]


@pytest.mark.parametrize("cls, kwargs, needles", BAD, ids=[f"{c.__name__}-{k}" for c, k, _ in BAD])
def test_bad_value_names_value_and_allowed(cls, kwargs, needles):
    with pytest.raises(ConfigError) as e:
        cls(**kwargs)
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))


def test_defaults_are_valid_and_frozen():
    for cls in (SamplingConfig, SpecConfig, GenerationConfig, ModelConfig):
        c = cls()
        with pytest.raises(dataclasses.FrozenInstanceError):
            c.__setattr__(dataclasses.fields(cls)[0].name, None)
    assert SamplingConfig().greedy and not SamplingConfig(temperature=0.5).greedy


def test_every_field_has_help():
    for cls in (SamplingConfig, SpecConfig, GenerationConfig, ModelConfig):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"


def test_max_draft_follows_num_draft_unless_given():
    assert SpecConfig().max_draft == MAX_DRAFT
    assert SpecConfig(num_draft=16).max_draft == 16
    assert SpecConfig(num_draft=16, max_draft=20).max_draft == 20
    assert SpecConfig(num_draft=2, max_draft=2).max_draft == 2


def test_stop_is_normalised_to_a_tuple():
    assert GenerationConfig(stop="END").stop == ("END",)
    assert GenerationConfig(stop=["a", "b"]).stop == ("a", "b")


def test_a_method_option_for_its_method_and_a_draft_for_any_method():
    assert SpecConfig(method="early-exit", exit_layer=3).exit_layer == 3
    assert SpecConfig(method="lookup", draft="somewhere").draft == "somewhere"  # kept for switching
    for name in registry.NAMES:
        entry = registry.get(name)
        SpecConfig(method=name, draft="d" if entry.needs_draft else None)


# -- the registry -----------------------------------------------------------------------------

def test_registry_entries_are_well_formed():
    spec_fields = {f.name for f in dataclasses.fields(SpecConfig)}
    assert len(set(registry.NAMES)) == len(registry.NAMES)
    for m in registry.METHODS:
        assert m.summary and callable(registry.BUILDERS[m.name]) and m.name == m.name.strip()
        assert set(m.reads) <= spec_fields, (m.name, set(m.reads) - spec_fields)
    for f in dataclasses.fields(SpecConfig):
        if f.metadata.get("exclusive"):
            assert registry.readers(f.name), f"exclusive option {f.name} is read by no method"


def test_which_methods_need_a_draft_model_is_decided_by_the_registry():
    assert {m.name for m in registry.METHODS if m.needs_draft} == {"draft", "cascade"}
    assert "cascade" not in registry.available(None) and "draft" not in registry.available(None)
    assert registry.available("d", heads={"eagle3", "medusa", "corpus", "mtp"}) == registry.NAMES
    assert [m.name for m in registry.METHODS if m.arm] == ["none", "lookup", "draft",
                                                                       "eagle3", "corpus", "mtp"]


def test_registry_lookup_error_lists_every_method():
    with pytest.raises(ConfigError, match="unknown method 'nope'; choose one of: " + ", ".join(registry.NAMES)):
        registry.get("nope")


def test_a_method_that_needs_a_head_is_available_only_with_one():
    assert {m.name for m in registry.METHODS if m.needs_head} == {"eagle3", "medusa", "corpus"}
    assert not {"eagle3", "medusa", "corpus"} & set(registry.available("d"))
    assert "eagle3" in registry.available(None, heads={"eagle3"})
    assert "medusa" not in registry.available(None, heads={"eagle3"})
    SpecConfig(method="eagle3")  # valid: the head is looked for when the drafter is built
    assert SpecConfig(method="medusa", head="/some/dir").head == "/some/dir"
    with pytest.raises(ConfigError, match="head applies to method 'eagle3' or 'medusa' or 'corpus' or 'auto'"):
        SpecConfig(method="lookup", head="/some/dir")
    with pytest.raises(ConfigError, match="head must be a head directory"):
        SpecConfig(method="eagle3", head="  ")
