"""The head methods on every surface: ``--head DIR`` or a head found for the model (through
``$EDGESPEC_HEADS``), the error that names the model and ``edgespec train`` when there is none
(Python: ConfigError; CLI: exit 2, one line; server: 400 at request time, ConfigError at start),
``auto`` with an EAGLE-3 arm. Random heads: the output is plain decoding's."""

from __future__ import annotations

import weakref

import httpx
import mlx.core as mx
import pytest
from click.testing import CliRunner

from edgespec import Engine, SpecConfig, make_drafter
from edgespec.cli import main
from edgespec.drafters import registry
from edgespec.drafters.auto import AutoDrafter
from edgespec.drafters.eagle3 import Eagle3Drafter
from edgespec.drafters.medusa import MedusaDrafter
from edgespec.errors import ConfigError, HeadError
from edgespec.heads import Eagle3Head, HeadConfig, MedusaHeads, save_head
from edgespec.server import ServerSettings, ServerState
from edgespec.targets import cost
from edgespec.targets.cost import CostCurve

from .live_server import HI, LiveServer, assert_error, chat

PROMPT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def model(tiny_models):
    path = tiny_models.path(tie=False)
    return path, tiny_models.load(tie=False)


@pytest.fixture(scope="module")
def heads(model, tmp_path_factory):
    """A random EAGLE-3 head and random Medusa heads for the model, saved as `edgespec train`
    saves them: <root>/eagle3 and <root>/medusa."""
    _, target = model
    root = tmp_path_factory.mktemp("heads")
    mx.random.seed(0)
    for kind, module in (("eagle3", Eagle3Head), ("medusa", MedusaHeads)):
        config = HeadConfig.for_target(target, kind, num_heads=3)
        save_head(root / kind, config, module(config))
    return root


@pytest.fixture(autouse=True)
def no_measuring(monkeypatch, tmp_path):
    """The cost curve is a fixed CPU-like one (measuring is test_cost.py's business)."""
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path))
    monkeypatch.delenv("EDGESPEC_HEADS", raising=False)
    monkeypatch.setattr(cost, "measure_cost_curve",
                        lambda target: CostCurve((1, 2, 8), (20.0, 24.0, 44.0)))
    monkeypatch.setattr(cost, "_memo", {})
    monkeypatch.setattr(cost, "_by_target", weakref.WeakKeyDictionary())


def plain(target, max_tokens=16):
    return Engine(target).generate(PROMPT, max_tokens=max_tokens).token_ids


@pytest.mark.parametrize("kind, cls", [("eagle3", Eagle3Drafter), ("medusa", MedusaDrafter)])
def test_head_given_or_found(model, heads, monkeypatch, kind, cls):
    _, target = model
    for spec in (SpecConfig(method=kind, head=str(heads / kind)),
                 SpecConfig(method=kind, head=str(heads / kind), adaptive=False, num_draft=3)):
        drafter = make_drafter(spec, target)
        assert isinstance(drafter, cls)
        assert Engine(target, drafter).generate(PROMPT, max_tokens=16).token_ids == plain(target)
    with pytest.raises(ConfigError, match=rf"needs a trained {kind} head and none was found for "
                                          rf"model {target.name}.*edgespec train {kind}"):
        make_drafter(SpecConfig(method=kind), target)
    monkeypatch.setenv("EDGESPEC_HEADS", str(heads))
    assert isinstance(make_drafter(SpecConfig(method=kind), target), cls)
    assert kind in registry.available(None, registry.heads_for(target))


def test_a_head_of_the_wrong_kind_or_target(model, heads, tiny_models):
    _, target = model
    with pytest.raises(ConfigError, match="is a medusa head; method 'eagle3' needs an? eagle3"):
        make_drafter(SpecConfig(method="eagle3", head=str(heads / "medusa")), target)
    with pytest.raises(ConfigError, match="not a head directory"):
        make_drafter(SpecConfig(method="eagle3", head=str(heads)), target)
    other = tiny_models.load(tie=False, seed=9)  # same shapes, other weights
    with pytest.raises(HeadError, match="fingerprint"):
        make_drafter(SpecConfig(method="eagle3", head=str(heads / "eagle3")), other)


def test_auto_leaves_out_its_eagle3_arm_on_a_steep_curve(model, heads, monkeypatch):
    """Where 8 nodes cost 1.45 times 1 or more (a quantized target on a CPU), auto has no
    EAGLE-3 arm, unless a head was given; on a flatter curve it has one."""
    from edgespec.drafters import registry
    from edgespec.targets import cost

    monkeypatch.undo()  # the real rule, not conftest's flat curve
    assert registry._steep.__module__ == registry.__name__
    _, target = model
    monkeypatch.setenv("EDGESPEC_HEADS", str(heads))
    steep = cost.CostCurve((1, 8), (10.0, 18.0))
    flat = cost.CostCurve((1, 8), (10.0, 14.0))
    assert steep.ratio_8() >= registry.STEEP_RATIO > flat.ratio_8()
    for curve, has in ((steep, False), (flat, True)):
        monkeypatch.setattr(cost, "verify_cost_curve", lambda t, curve=curve: curve)
        assert ("eagle3" in make_drafter(SpecConfig(method="auto"), target).arms) is has
    monkeypatch.setattr(cost, "verify_cost_curve", lambda t: steep)
    given = make_drafter(SpecConfig(method="auto", head=str(heads / "eagle3")), target)
    assert "eagle3" in given.arms


def test_auto_gets_an_eagle3_arm_when_a_head_exists(model, heads, monkeypatch):
    _, target = model
    assert "eagle3" not in make_drafter(SpecConfig(method="auto"), target).arms
    monkeypatch.setenv("EDGESPEC_HEADS", str(heads))
    auto = make_drafter(SpecConfig(method="auto"), target)
    assert isinstance(auto, AutoDrafter) and isinstance(auto.arms["eagle3"], Eagle3Drafter)
    assert auto.target_features == tuple(sorted(set(auto.arms["eagle3"].target_features)))
    res = Engine(target, auto).generate(PROMPT, max_tokens=24)
    assert res.token_ids == plain(target, 24)
    assert auto.pulls["eagle3"] > 0  # it was tried, learning from every step's features


def test_the_interactive_default_is_eagle3_where_the_native_kernels_run(model, heads,
                                                                         monkeypatch):
    """chat, serve and the API pick a found EAGLE-3 head for a float target on the native CPU
    kernels (where it was measured to pay), and the corpus or lookup elsewhere."""
    from edgespec.kernels import backend
    from edgespec.drafters.default import interactive_method

    _, target = model
    assert interactive_method(None, target) == "lookup"  # no head found yet
    monkeypatch.setenv("EDGESPEC_HEADS", str(heads))
    monkeypatch.setattr(backend, "native_enabled", lambda: True)
    assert interactive_method(None, target) == "eagle3"
    monkeypatch.setattr(target, "quantized", True)  # a 4-bit target: its heads were slower
    assert interactive_method(None, target) == "lookup"
    monkeypatch.setattr(target, "quantized", False)
    monkeypatch.setattr(backend, "native_enabled", lambda: False)  # pure MLX, or a GPU
    assert interactive_method(None, target) == "lookup"
    assert interactive_method(None, target, head=str(heads / "medusa")) == "medusa"  # --head


def test_cli_without_a_head_exits_2_with_one_line(model, heads):
    path, target = model
    result = CliRunner().invoke(main, ["generate", "--model", str(path), "--method", "eagle3",
                                       "--max-tokens", "8", PROMPT])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "edgespec train eagle3" in lines[0] and target.name in lines[0]
    result = CliRunner().invoke(main, ["generate", "--model", str(path), "--method", "eagle3",
                                       "--head", str(heads / "eagle3"), "--raw", "--json",
                                       "--max-tokens", "12", PROMPT])
    assert result.exit_code == 0, result.output
    assert '"method": "eagle3"' in result.output


def test_server_without_a_head(model):
    path, target = model
    srv = LiveServer(ServerSettings(model=str(path)))
    try:
        assert "eagle3" not in srv.health()["methods"]
        r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": HI, "method": "eagle3"})
        err = assert_error(r, 400, param="method")
        assert "edgespec train eagle3" in err["message"] and target.name in err["message"]
    finally:
        srv.stop()
    with pytest.raises(ConfigError, match="edgespec train medusa"):
        ServerState.start(ServerSettings(model=str(path), method="medusa"), progress=False).stop()


def test_server_with_a_head(model, heads):
    path, target = model
    srv = LiveServer(ServerSettings(model=str(path), spec_options={"head": str(heads / "eagle3")},
                                    aliases=("gpt-4o-mini",)))
    try:
        assert "eagle3" in srv.health()["methods"] and "medusa" not in srv.health()["methods"]
        client = srv.client()
        want = chat(client, max_tokens=16, extra_body={"method": "none"}).choices[0].message.content
        r = chat(client, max_tokens=16, extra_body={"method": "eagle3"})
        assert r.choices[0].message.content == want
        assert r.usage.model_extra["speculative"]["method"] == "eagle3"
    finally:
        srv.stop()
