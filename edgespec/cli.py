"""The ``edgespec`` command: generate, bench, doctor, make-draft.

Options for sampling and speculation are generated from the config dataclasses (``options_for``)
and validated by constructing them, so the CLI, the server and the Python API accept the same
values with the same messages. Any EdgespecError becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys

import click

from .config import DTYPES, METHODS, GenerationConfig, SamplingConfig, SpecConfig
from .errors import EdgespecError

_FLAG_NAMES = {"temperature": "temp", "max_tokens": "max-tokens"}
_SKIP = {"adaptive", "max_draft", "stop"}


def _fail(message: str) -> None:
    click.echo(f"edgespec: error: {message}", err=True)
    sys.exit(2)


def guarded(fn):
    """Turn edgespec's typed errors (and Ctrl+C) into one line and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except EdgespecError as e:
            _fail(str(e))
        except KeyboardInterrupt:
            click.echo("\nedgespec: interrupted", err=True)
            sys.exit(130)
        except OSError as e:
            _fail(f"{e.strerror or e}: {e.filename}" if getattr(e, "filename", None) else str(e))

    return wrapper


def _click_type(f: dataclasses.Field):
    """click type from a field's annotation ('int | None' -> int); None lets click infer (bool)."""
    annotation = str(f.type)
    for name, kind in (("bool", None), ("int", int), ("float", float), ("str", str)):
        if annotation.startswith(name):
            return kind
    return str


def options_for(*classes):
    """click options for the fields of config dataclasses (types and help from the definitions)."""

    def decorate(fn):
        for cls in reversed(classes):
            for f in reversed(dataclasses.fields(cls)):
                if f.name in _SKIP or f.name == "method":
                    continue
                flag = "--" + _FLAG_NAMES.get(f.name, f.name.replace("_", "-"))
                kind = _click_type(f)
                fn = click.option(flag, f.name, type=kind, default=None, show_default=False,
                                  help=f"{f.metadata.get('help', '')} [default: {f.default}]")(fn)
        return fn

    return decorate


def build_configs(kw: dict, method: str) -> tuple[SamplingConfig, SpecConfig, GenerationConfig]:
    """Config objects from parsed options; unset options keep the dataclass defaults."""

    def pick(cls):
        names = {f.name for f in dataclasses.fields(cls)}
        return {k: v for k, v in kw.items() if k in names and v is not None}

    spec_kw = pick(SpecConfig)
    return (SamplingConfig(**pick(SamplingConfig)), SpecConfig(method=method, **spec_kw),
            GenerationConfig(**pick(GenerationConfig)))


method_option = click.option("--method", default="none", show_default=True,
                             type=click.Choice(METHODS), help="drafting method")
model_option = click.option("--model", "model_ref", default="demo", show_default=True,
                            help="HF repo id, local model dir, .gguf file, or 'demo'")
dtype_option = click.option("--dtype", default=None, type=click.Choice(DTYPES),
                            help="weight dtype [default: float32 on CPU, native on GPU]")


class LazyGroup(click.Group):
    """A group whose heavier commands (server, TUI) are imported only when used."""

    lazy = {
        "serve": ("edgespec.server.cli:serve", "Serve an OpenAI-compatible endpoint on loopback."),
        "chat": ("edgespec.tui.cli:chat", "Chat in the terminal, accepted drafts shown live."),
    }

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx, name):
        if name not in self.lazy:
            return super().get_command(ctx, name)
        import importlib

        module, attr = self.lazy[name][0].split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as e:
            raise click.ClickException(f"`edgespec {name}` needs {e.name!r}, which is not installed; "
                                       "run scripts/setup.sh or pip install 'edgespec'") from None

    def format_commands(self, ctx, formatter):
        rows = [(n, (self.lazy[n][1] if n in self.lazy else
                     self.commands[n].get_short_help_str(limit=60))) for n in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="edgespec")
def main() -> None:
    """edgespec: speculative decoding for local LLMs on MLX — faster, same output."""


def load_engine(model_ref: str, dtype, sampling: SamplingConfig, spec: SpecConfig):
    from . import Engine, load, make_drafter

    target = load(model_ref, dtype=dtype)
    return Engine(target, make_drafter(spec, target, sampling), sampling)


@main.command()
@model_option
@method_option
@options_for(SpecConfig, SamplingConfig, GenerationConfig)
@click.option("--stop", multiple=True, help="stop string (repeatable)")
@click.option("--system", default=None, help="system message")
@click.option("--raw", is_flag=True, help="send the prompt as raw text, not as a chat message")
@dtype_option
@click.option("--json", "as_json", is_flag=True, help="print one JSON object with text, token_ids, stats")
@click.argument("prompt")
@guarded
def generate(model_ref, method, prompt, system, raw, dtype, as_json, stop, **kw):
    """Generate a reply to PROMPT (as a chat message unless --raw)."""
    sampling, spec, gen = build_configs(dict(kw, stop=stop), method)
    if not prompt.strip():
        raise EdgespecError("the prompt is empty; give some text")
    engine = load_engine(model_ref, dtype, sampling, spec)
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}]
    query = prompt if raw else messages
    if as_json:
        res = engine.generate(query, generation=gen)
        out = {"text": res.text, "token_ids": res.token_ids, "finish_reason": res.finish_reason,
               "method": engine.method, "stats": res.stats.as_dict()}
        click.echo(json.dumps(out))
        return
    for step in engine.stream(query, generation=gen):
        click.echo(step.text, nl=False)
    click.echo()
    click.echo(engine.last_stats.summary(), err=True)


@main.command()
@model_option
@click.option("--prompts", "prompts_file", required=True, help="jsonl with 'turns' and 'category'")
@click.option("--methods", default="none,draft", show_default=True, help="comma-separated methods")
@click.option("--draft", default=None, help="draft model reference (method 'draft')")
@click.option("--num-draft", default=4, show_default=True, type=int, help="draft tokens per step")
@click.option("--max-tokens", default=128, show_default=True, type=int, help="new tokens per prompt")
@click.option("--limit", default=None, type=int, help="use N prompts (round-robin over categories)")
@click.option("--json", "json_out", default=None, help="write the full report as JSON to this file")
@dtype_option
@guarded
def bench(model_ref, prompts_file, methods, draft, num_draft, max_tokens, limit, json_out, dtype):
    """Measure methods against plain decoding, in one process, over a prompts file."""
    from . import bench as benchmod
    from .targets import load

    names = [m.strip() for m in methods.split(",") if m.strip()]
    for m in names:
        SpecConfig(method=m, draft=draft or ("-" if m in benchmod.NEEDS_DRAFT else None),
                   num_draft=num_draft)
    needing = [m for m in names if m in benchmod.NEEDS_DRAFT]
    if needing and not draft:
        raise EdgespecError(f"method {needing[0]!r} needs --draft REF (make one with `edgespec make-draft`)")
    GenerationConfig(max_tokens=max_tokens)
    if limit is not None and limit < 1:
        raise EdgespecError(f"--limit must be >= 1, got {limit}")
    prompts = benchmod.load_prompts(prompts_file, limit=limit)
    target = load(model_ref, dtype=dtype)
    report = benchmod.run_bench(target, names, prompts, max_tokens=max_tokens, draft_ref=draft,
                                num_draft=num_draft, prompts_file=prompts_file)
    if json_out:
        with open(json_out, "w") as f:
            json.dump(report, f, indent=2)
    click.echo(benchmod.report_markdown(report))


@main.command("make-draft")
@model_option
@click.option("--layers", required=True, type=int, help="keep the first N layers")
@click.option("--out", "out_dir", required=True, help="output model directory")
@guarded
def make_draft(model_ref, layers, out_dir):
    """Write a draft model made of the target's first N layers, final norm and LM head."""
    from .loading.hub import resolve_model
    from .targets.derive import truncate_model

    path = truncate_model(resolve_model(model_ref), layers, out_dir)
    click.echo(f"wrote {path} ({layers} layers of {model_ref})")


@main.command()
@model_option
@dtype_option
@click.option("--json", "as_json", is_flag=True, help="print the findings as JSON")
@guarded
def doctor(model_ref, dtype, as_json):
    """Report backend, BLAS, and forward timings (1 vs 8 tokens) and plain decoding speed."""
    from .doctor import format_findings, run_doctor

    findings = run_doctor(model_ref, dtype)
    click.echo(json.dumps(findings, indent=2) if as_json else format_findings(findings))


if __name__ == "__main__":
    main()
