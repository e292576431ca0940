"""Every surface's options come from the config dataclasses (``edgespec/options.py``): a field
added to a config class shows up in the CLI commands, the server's request schema and the
configs built from either; surfaces that differ on purpose say so in their --help."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap

import click
import pytest
from click.testing import CliRunner

from edgespec import options
from edgespec.cli import main
from edgespec.config import SpecConfig
from edgespec.drafters import registry
from edgespec.errors import ConfigError
from edgespec.generation_defaults import CHAT

COMMANDS = ("generate", "bench", "serve", "chat")

# Run in a fresh interpreter: each config class gains a field *before* the CLI, the server
# schema and the options module are imported; everything below must pick the fields up.
EXTEND = textwrap.dedent("""
    import dataclasses, json
    import edgespec.config as c

    def extend(cls, name, kind, default):
        f = dataclasses.field(default=default, metadata={"help": f"test field {name}"})
        return dataclasses.make_dataclass(cls.__name__, [(name, kind, f)], bases=(cls,), frozen=True)

    c.SamplingConfig = extend(c.SamplingConfig, "typical_p", "float", 1.0)
    c.SpecConfig = extend(c.SpecConfig, "tree_width", "int", 1)
    c.GenerationConfig = extend(c.GenerationConfig, "min_tokens", "int", 0)

    from click.testing import CliRunner
    from types import SimpleNamespace
    from edgespec import options
    from edgespec.cli import main
    from edgespec.drafters import registry
    from edgespec.server import convert
    from edgespec.server.schemas import ChatCompletionRequest, CompletionRequest
    from edgespec.server.state import ServerSettings

    out = {cmd: CliRunner().invoke(main, [cmd, "--help"], terminal_width=200).output
           for cmd in ("generate", "bench", "serve", "chat")}
    out["chat_request"] = sorted(ChatCompletionRequest.model_fields)
    out["completion_request"] = sorted(CompletionRequest.model_fields)
    new = {"typical_p": 0.5, "tree_width": 3, "min_tokens": 2}
    out["python"] = [sorted(options.checked(s, new)) for s in ("python", "call")]
    api = options.configs("generate", new)
    out["api"] = [api.sampling.typical_p, api.spec.tree_width, api.generation.min_tokens]
    body = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], typical_p=0.5,
                                 tree_width=3, min_tokens=2)
    state = SimpleNamespace(settings=ServerSettings(), method="lookup", methods=registry.NAMES,
                            sampling={})
    gen, sampling, spec = convert._configs(body, state, None, "max_tokens")
    out["server"] = [sampling.typical_p, spec.tree_width, gen.min_tokens]
    print(json.dumps(out))
""")


def test_a_field_added_to_a_config_class_reaches_every_surface():
    proc = subprocess.run([sys.executable, "-c", EXTEND], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for cmd in COMMANDS:  # serve takes the speculation options; requests choose the rest
        expected = ["--tree-width"] if cmd == "serve" else ["--typical-p", "--tree-width", "--min-tokens"]
        for flag in expected:
            assert flag in out[cmd], (cmd, flag)
    for fields in (out["chat_request"], out["completion_request"]):
        assert {"typical_p", "tree_width", "min_tokens"} <= set(fields)
    assert out["api"] == [0.5, 3, 2]  # the configs built from keywords
    assert out["python"] == [["min_tokens", "tree_width", "typical_p"]] * 2  # load() and a call
    assert out["server"] == [0.5, 3, 2]  # a request body through the server's conversion


def _params(command: click.Command) -> set[str]:
    return {p.name for p in command.params}


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_takes_its_surface_fields(name):
    command = main.get_command(click.Context(main), name)
    surface = {f.name for f in options.SURFACES[name].fields()}
    assert surface <= _params(command), surface - _params(command)


def test_help_states_where_a_surface_differs():
    def help_of(name):
        return CliRunner().invoke(main, [name, "--help"], terminal_width=200).output

    generate, bench, chat, serve = (help_of(n) for n in ("generate", "bench", "chat", "serve"))
    assert "[default: 256]" in generate
    assert "[default: 128: bench's own" in bench and "--method " not in bench
    for text in (generate, chat, serve):
        assert ("[default: 'draft' with --draft, else the kind of a --head folder given, else "
                "'eagle3' when the model has an EAGLE-3 head, its weights are not quantized and "
                "the native CPU kernels run, else 'corpus' when it has one, else "
                "'lookup']") in " ".join(text.split())  # wrapped where the help is long
    assert "--temperature" in bench and "--seed" in bench and "--max-draft" in bench


def test_values_configs_and_flags():
    c = options.configs("generate", {"temperature": 0.5, "num_draft": 16, "stop": ("END",),
                                     "adaptive": False, "method": "lookup", "unrelated": 1})
    assert c.sampling.temperature == 0.5 and c.generation.stop == ("END",)
    assert c.spec.num_draft == 16 and c.spec.max_draft == 16 and c.spec.adaptive is False
    assert options.values("chat", {}) == {"method": "lookup", **CHAT}  # the chat's sampling
    assert options.values("chat", {"draft": "d"})["method"] == "draft"
    assert options.values("bench", {})["max_tokens"] == 128
    assert options.values("request", {"temperature": None, "stop": ()}) == {"temperature": 1.0}


def test_bool_and_repeatable_flags_parse():
    @click.command()
    @options.click_options("generate")
    def cmd(**kw):
        click.echo(json.dumps(options.given("generate", kw)))

    def parsed(*args):
        return json.loads(CliRunner().invoke(cmd, list(args)).output)

    assert parsed() == {}
    assert parsed("--no-adaptive", "--stop", "a", "--stop", "b", "--temp", "0.3") == {
        "adaptive": False, "stop": ["a", "b"], "temperature": 0.3}
    assert parsed("--adaptive")["adaptive"] is True


def test_spec_for_gives_an_exclusive_option_only_to_its_readers():
    shared = {"exit_layer": 2, "num_draft": 6, "draft": "d"}
    assert options.spec_for("early-exit", shared).exit_layer == 2
    lookup = options.spec_for("lookup", shared)
    assert lookup.exit_layer is None and lookup.num_draft == 6
    assert options.spec_for("lookup", shared, own={"num_draft": 9}).num_draft == 9  # own wins
    with pytest.raises(ConfigError, match="exit_layer applies to method 'early-exit' only"):
        options.spec_for("lookup", {}, own={"exit_layer": 2})  # meant for this method: an error
    with pytest.raises(ConfigError, match="unknown method"):
        options.spec_for("magic", shared)


def test_every_spec_field_is_a_request_field_but_draft_and_head():
    """The draft model and the trained head are loaded once, when the server starts: a request
    never names a file on the server."""
    request = {f.name for f in options.SURFACES["request"].fields()}
    spec = {f.name for f in dataclasses.fields(SpecConfig)}
    assert spec - request == {"draft", "head"}
    method = next(f for f in dataclasses.fields(SpecConfig) if f.name == "method")
    assert method.metadata["choices"] == registry.NAMES
