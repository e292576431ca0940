"""Sampling defaults (``generation_defaults.py``): the model's generation_config.json read as
transformers means it, under every value a request gives, over each surface's fallback; the
chat, the server and the Python API use them, bench and generate stay greedy unless told.
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from click.testing import CliRunner

from edgespec import options
from edgespec.cli import main
from edgespec.config import SamplingConfig
from edgespec.generation_defaults import CHAT, describe, model_sampling
from edgespec.tui.session import chat_sampling

OWN = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
       "repetition_penalty": 1.05, "bos_token_id": 1, "eos_token_id": 2}


def with_config(tmp_path, config: dict | None, name: str = "m"):
    d = tmp_path / name
    d.mkdir()
    if config is not None:
        (d / "generation_config.json").write_text(json.dumps(config))
    return d


@pytest.fixture
def own_model(tiny_models, tmp_path):
    """A copy of a tiny model whose generation_config.json sets sampling (``OWN``)."""
    d = tmp_path / "own"
    shutil.copytree(tiny_models.path(layers=2, scale=0.03), d)
    (d / "generation_config.json").write_text(json.dumps(OWN))
    return d


def test_reading_generation_config(tmp_path, caplog):
    own = model_sampling(with_config(tmp_path, OWN, "own"))
    assert own == {**{k: v for k, v in vars(SamplingConfig()).items() if k != "seed"},
                   "temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05}
    assert model_sampling(with_config(tmp_path, {"bos_token_id": 1}, "ids")) == {}  # the demo's
    assert model_sampling(with_config(tmp_path, None, "none")) == {}
    assert model_sampling(None) == {}
    greedy = model_sampling(with_config(tmp_path, {**OWN, "do_sample": False}, "greedy"))
    assert greedy["temperature"] == 0.0 and greedy["top_p"] == 1.0  # transformers: greedy
    assert greedy["repetition_penalty"] == 1.05  # ... which still applies its penalty
    assert model_sampling(with_config(tmp_path, {"do_sample": True, "top_k": 64},
                                      "sampled"))["temperature"] == 1.0  # transformers' default
    with caplog.at_level(logging.WARNING, "edgespec.generation_defaults"):
        bad = model_sampling(with_config(tmp_path, {"temperature": 0.7, "top_p": 0}, "bad"))
    assert bad["temperature"] == 0.7 and bad["top_p"] == 1.0  # the unusable value is left out
    assert "top_p" in caplog.text and "bad" in caplog.text
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "generation_config.json").write_text("{not json")
    assert model_sampling(tmp_path / "broken") == {}


def test_describe():
    assert describe(CHAT) == "temperature 0.7 · top_p 0.9 · repetition_penalty 1.1"
    greedy = {"temperature": 0.0, "repetition_penalty": 1.1}
    assert describe(greedy) == "greedy · repetition_penalty 1.1"


class _Target:
    def __init__(self, path):
        self.path = path


def test_chat_sampling_flags_over_the_model_over_the_chat(tmp_path):
    own, plain = _Target(with_config(tmp_path, OWN, "own")), _Target(None)
    config, origin = chat_sampling({}, plain)
    assert config == SamplingConfig(**CHAT) and origin == "the chat's defaults"
    config, origin = chat_sampling({}, own)
    assert (config.temperature, config.top_k, config.repetition_penalty) == (0.6, 20, 1.05)
    assert "generation_config.json" in origin
    config, _ = chat_sampling({"temperature": 0.0, "seed": 3}, own)  # greedy stays available
    assert config.greedy and config.seed == 3 and config.top_k == 20
    config, _ = chat_sampling({"top_p": 1.0}, plain)
    assert (config.temperature, config.top_p) == (CHAT["temperature"], 1.0)


def test_chat_help_shows_the_defaults():
    out = CliRunner().invoke(main, ["chat", "--help"]).output
    assert "generation_config.json" in out and "0.7" in out and "repetition" in out


def test_server_requests_default_to_the_model_settings(own_model, tiny_models):
    from edgespec.server import ServerSettings, ServerState
    from edgespec.server.convert import chat_request
    from edgespec.server.schemas import ChatCompletionRequest

    hi = [{"role": "user", "content": "hi"}]
    own = ServerState.start(ServerSettings(model=str(own_model)), progress=False)
    plain = ServerState.start(ServerSettings(model=str(tiny_models.path(layers=2, scale=0.03))),
                              progress=False)
    try:
        sampling = chat_request(ChatCompletionRequest(messages=hi), own).sampling
        assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.6, 0.95, 20)
        sent = chat_request(ChatCompletionRequest(messages=hi, temperature=0, top_p=0.5), own)
        assert sent.sampling.greedy and sent.sampling.top_p == 0.5 and sent.sampling.top_k == 20
        assert chat_request(ChatCompletionRequest(messages=hi), plain).sampling == SamplingConfig(
            temperature=1.0)  # OpenAI's, where the model sets none
    finally:
        own.stop()
        plain.stop()


def test_python_api_defaults_to_the_model_settings(own_model, tiny_models):
    import edgespec

    with edgespec.load(str(own_model), progress=False) as llm:
        _, sampling, _ = llm._configs({})
        assert (sampling.temperature, sampling.top_k,
                sampling.repetition_penalty) == (0.6, 20, 1.05)
        _, sampling, _ = llm._configs(options.checked("call", {"temperature": 0}))
        assert sampling.greedy
    with edgespec.load(str(own_model), progress=False, top_k=5) as llm:
        assert llm._configs({})[1].top_k == 5  # load's options over the model's
    with edgespec.load(str(tiny_models.path(layers=2, scale=0.03)), progress=False) as llm:
        assert llm._configs({})[1] == SamplingConfig()  # greedy where the model sets none


def test_bench_and_generate_stay_greedy(own_model, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"turns": ["hi"], "category": "x"}) + "\n")
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--model", str(own_model), "--prompts",
                                       str(prompts), "--methods", "none", "--max-tokens", "4",
                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["env"]["sampling"] == vars(SamplingConfig())
    assert options.configs("generate", {}).sampling == SamplingConfig()
