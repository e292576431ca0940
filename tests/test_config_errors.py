"""A model config.json with values no model can have stops the load with one ModelLoadError
naming the field and what it allows (``targets/config_check.py``), for every numeric field of
every supported family's config: not a ``math domain error``, a ZeroDivisionError or a model
that loads with a NaN norm epsilon. Through the CLI: a non-zero exit and one line, no traceback.

Each family's tiny random model (``tests/oracle.py``'s configs) is written once; each case
rewrites only its config.json, next to links to the same weights and tokenizer.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgespec.errors import ModelLoadError
from edgespec.targets import load_target
from edgespec.targets.config_check import FRACTIONS, ZERO_IS_NONE
from edgespec.targets.families import family_of

from .oracle import CONFIGS, make_oracle_model

pytest.importorskip("mlx_lm")

# one config per family file, and the two that nest the text model under text_config
FAMILY_CONFIGS = ["llama", "qwen3", "gemma3", "gemma2", "phi3", "smollm3", "gemma4_text",
                  "qwen3_moe", "mixtral", "gpt_oss", "qwen3_5", "qwen3_next", "lfm2",
                  "gemma4-nested", "qwen3_5_moe-nested"]
_NUMERIC = {"int": int, "int | None": int, "float": float, "float | None": float}


def _numeric_fields(name: str) -> list[tuple[str, type]]:
    """(field, int or float) of each numeric field of the family that runs config ``name``."""
    args = family_of(CONFIGS[name]).args
    return [(f.name, _NUMERIC[str(f.type)]) for f in dataclasses.fields(args)
            if str(f.type) in _NUMERIC]


CASES = [(name, field, kind) for name in FAMILY_CONFIGS for field, kind in _numeric_fields(name)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Config name -> (its model directory, its config.json as written); each one loads."""
    root = tmp_path_factory.mktemp("config_errors")
    made = {}
    for name in FAMILY_CONFIGS:
        path = make_oracle_model(root / name, CONFIGS[name])
        load_target(path, dtype="float32")  # the unchanged config is accepted
        made[name] = path, json.loads((path / "config.json").read_text())
    return made


def _variant(models, name: str, change: dict) -> Path:
    """A directory of config ``name``'s model whose config.json has ``change`` (under
    ``text_config`` where the config nests its text model there)."""
    path, config = models[name]
    scratch = path.parent / f"{name}-changed"
    if not scratch.exists():
        scratch.mkdir()
        for f in path.iterdir():
            if f.name != "config.json":
                (scratch / f.name).symlink_to(f)
    if "text_config" in config:
        config = {**config, "text_config": {**config["text_config"], **change}}
    else:
        config = {**config, **change}
    (scratch / "config.json").write_text(json.dumps(config))
    return scratch


def _field_named(models, name: str, field: str) -> str:
    """The field as the error names it: nested ones under ``text_config.``, but for the "every
    n-th layer" fields, which ``DecoderArgs.check_layers`` names as '<model_type> config: F'."""
    nested = "text_config" in models[name][1] and field not in family_of(CONFIGS[name]).args.PERIODS
    return ("text_config." if nested else "") + field


def _refused(models, name: str, field: str, value) -> ModelLoadError:
    path = _variant(models, name, {field: value})
    with pytest.raises(ModelLoadError) as e:
        load_target(path, dtype="float32")
    message = str(e.value)
    assert "\n" not in message
    assert f"{_field_named(models, name, field)} is {value!r}" in message, message
    return e.value


@pytest.mark.parametrize("name, field, kind", CASES, ids=[f"{n}.{f}" for n, f, _ in CASES])
def test_zero_negative_and_nan_are_refused_naming_the_field(models, name, field, kind):
    bad = [-1, math.nan] + ([] if field in ZERO_IS_NONE else [0])
    for value in bad:
        error = _refused(models, name, field, value)
        assert "it must be" in str(error) and (">" in str(error) or "in [" in str(error)
                                              or "divisor" in str(error) or "(0, 1]" in str(error))


def _bad_values(field: str, kind: type):
    """Values outside what ``field`` of ``kind`` allows: the wrong type, non-finite, too small."""
    wrong_type = st.one_of(st.booleans(), st.text(max_size=3), st.lists(st.integers(), max_size=2))
    if kind is int:
        low = 0 if field in ZERO_IS_NONE else 1
        return st.one_of(wrong_type, st.integers(max_value=low - 1),
                         st.floats(allow_nan=True).filter(lambda x: not float(x).is_integer()),
                         st.sampled_from([math.nan, math.inf, -math.inf]))
    high = st.floats(min_value=1.0, exclude_min=True) if field in FRACTIONS else st.nothing()
    return st.one_of(wrong_type, st.floats(max_value=0.0), high,
                     st.sampled_from([math.nan, math.inf, -math.inf]))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_bad_value_of_any_field_is_refused_naming_it(models, data):
    name, field, kind = data.draw(st.sampled_from(CASES))
    value = data.draw(_bad_values(field, kind))
    path = _variant(models, name, {field: value})
    with pytest.raises(ModelLoadError) as e:
        load_target(path, dtype="float32")
    assert _field_named(models, name, field) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", FAMILY_CONFIGS)
def test_a_layer_count_past_the_weights_is_refused(models, name):
    config = models[name][1]
    layers = config.get("num_hidden_layers") or config["text_config"]["num_hidden_layers"]
    for value in (layers + 1, 10**9):
        error = _refused(models, name, "num_hidden_layers", value)
        assert f"an integer in [1, {layers}]" in str(error)


def test_heads_that_do_not_divide_are_refused(models):
    error = _refused(models, "llama", "num_attention_heads", 3)  # hidden 64, no head_dim
    assert "a divisor of hidden_size (64) when head_dim is not given" in str(error)
    error = _refused(models, "llama", "num_key_value_heads", 3)  # 4 heads
    assert "a divisor of num_attention_heads (4)" in str(error)
    error = _refused(models, "qwen3_next", "linear_num_key_heads", 3)
    assert "a divisor of linear_num_value_heads" in str(error)
    error = _refused(models, "mixtral", "num_experts_per_tok", 5)  # of 4 experts
    assert "an integer in [1, 4]" in str(error)


def test_a_given_head_size_need_not_divide(models):
    """qwen3's head_dim is given: the hidden size need not be heads x head_dim."""
    path = _variant(models, "qwen3", {"num_attention_heads": 4, "head_dim": 32})
    assert load_target(path, dtype="float32").args.head_dim == 32


@pytest.mark.parametrize("change, field", [
    ({"rms_norm_eps": math.nan}, "rms_norm_eps is nan"),
    ({"num_attention_heads": 3}, "num_attention_heads is 3")])
def test_the_cli_says_it_in_one_line(models, change, field):
    path = _variant(models, "llama", change)
    proc = subprocess.run([sys.executable, "-m", "edgespec.cli", "generate", "--model", str(path),
                           "--max-tokens", "2", "hello"], capture_output=True, text=True)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(field, lines[0]) and "it must be" in lines[0]
