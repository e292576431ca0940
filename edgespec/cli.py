"""The ``edgespec`` command: generate, bench, doctor, make-draft, train (serve and chat load lazily).

Options for the model, speculation, sampling and generation are generated from the config
dataclasses (``options.py``) and validated by constructing them, so the CLI, the server and the
Python API accept the same values with the same messages. Any EdgespecError becomes one line on
stderr and exit status 2.
"""

from __future__ import annotations

import functools
import json
import sys

import click

from . import options
from .drafters.default import method_for_model
from .drafters.registry import NAMES, readers
from .errors import EdgespecError
from .extras import missing_extra
from .training import settings as train_settings
from .training.settings import KINDS as TRAIN_KINDS


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
        except ModuleNotFoundError as e:  # an optional module: name the extra that brings it
            ctx = click.get_current_context(silent=True)
            err = missing_extra(f"edgespec {ctx.info_name if ctx else fn.__name__}", e)
            if err is None:
                raise
            _fail(str(err))
        except KeyboardInterrupt:
            click.echo("\nedgespec: interrupted", err=True)
            sys.exit(130)
        except OSError as e:
            _fail(f"{e.strerror or e}: {e.filename}" if e.filename else str(e))

    return wrapper


class LazyGroup(click.Group):
    """A group whose heavier commands (server, TUI) are imported only when used."""

    lazy = {
        "serve": ("edgespec.server.cli:serve", "Serve an OpenAI-compatible endpoint on loopback."),
        "chat": ("edgespec.tui.cli:chat", "Chat in the terminal, accepted drafts shown live."),
        "learn": ("edgespec.learn_cli:learn", "Learn from your own use: status, run, rollback, "
                  "forget."),
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
            err = missing_extra(f"edgespec {name}", e)
            if err is None:
                raise
            _fail(str(err))

    def format_commands(self, ctx, formatter):
        rows = [(n, (self.lazy[n][1] if n in self.lazy else
                     self.commands[n].get_short_help_str(limit=60))) for n in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="edgespec")
def main() -> None:
    """edgespec: speculative decoding for local LLMs on MLX — faster, same output."""


def load_engine(c: options.Configs, method_named: bool = True, prediction: str | None = None):
    """The engine for ``c``; unless ``method_named``, its method is the interactive default for
    the loaded model (``method_for_model``: an EAGLE-3 head or the corpus where one is
    found). ``prediction``: a predicted output's text, drafted first (``--prediction``)."""
    from . import Engine, load_target, make_drafter
    from .prompt import encode_prediction

    target = load_target(c.model.model, dtype=c.model.dtype)
    spec = method_for_model(c.spec, method_named, target)
    predicted = None if prediction is None else encode_prediction(target.tokenizer, prediction)
    return Engine(target, make_drafter(spec, target, c.sampling, prediction=predicted), c.sampling)


def _read_text(path: str, flag: str) -> str:
    from pathlib import Path

    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise EdgespecError(f"{flag} {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _schema_grammar(path: str):
    """The grammar of ``--json-schema FILE`` (checked before the model loads)."""
    from .grammar import Grammar

    try:
        schema = json.loads(_read_text(path, "--json-schema"))
    except json.JSONDecodeError as e:
        raise EdgespecError(f"--json-schema {path} is not JSON: {e}") from None
    return Grammar.json_schema(schema, True, f"--json-schema {path}")


@main.command()
@options.click_options("generate")
@click.option("--system", default=None, help="system message")
@click.option("--raw", is_flag=True, help="send the prompt as raw text, not as a chat message")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object with text, token_ids, stats")
@click.option("--prediction", type=click.Path(exists=True, dir_okay=False), default=None,
              help="predicted output: a file the answer is expected to mostly repeat (the file "
                   "an edit rewrites); drafted first, same output")
@click.option("--json-schema", "json_schema", type=click.Path(exists=True, dir_okay=False),
              default=None, help="structured output: a JSON schema file the answer must validate "
                                 "against (enforced by a grammar, strict; same output any method)")
@click.option("--logprobs", type=int, default=None,
              help="with --json: each token's log-probability under the model's raw "
                   "distribution and its N (0-20) likeliest alternatives")
@click.option("--suffix", type=click.Path(exists=True, dir_okay=False), default=None,
              help="fill in the middle: a file with the code after the hole; PROMPT is the code "
                   "before it (raw text), in the model's own FIM format")
@click.argument("prompt")
@guarded
def generate(prompt, system, raw, as_json, prediction, json_schema, logprobs, suffix, **kw):
    """Generate a reply to PROMPT (as a chat message unless --raw or --suffix)."""
    c = options.configs("generate", kw)
    if not prompt.strip():
        raise EdgespecError("the prompt is empty; give some text")
    if logprobs is not None and not as_json:
        raise EdgespecError("--logprobs goes with --json (the values are printed in its object)")
    if suffix is not None and system:
        raise EdgespecError("--system does not go with --suffix: a fill-in-the-middle prompt is "
                            "raw code (PROMPT before the hole, the file after it), no chat turn")
    from .logprobs import check_top

    check_top(logprobs, "--logprobs")
    predicted = _read_text(prediction, "--prediction") if prediction is not None else None
    grammar = _schema_grammar(json_schema) if json_schema is not None else None
    if grammar is not None:
        from .grammar import check_stop
        check_stop(grammar, c.generation.stop, "--stop")
    engine = load_engine(c, method_named="method" in options.given("generate", kw),
                         prediction=predicted)
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}]
    query = prompt if raw else messages
    if suffix is not None:
        query, c = _fim_query(engine, prompt, _read_text(suffix, "--suffix"), c)
    rules = None
    if grammar is not None:
        from .grammar import GrammarRule
        rules = GrammarRule(grammar, engine.target.tokenizer)
    if as_json:
        res = engine.generate(query, generation=c.generation, rules=rules, logprobs=logprobs)
        out = {"text": res.text, "token_ids": res.token_ids, "finish_reason": res.finish_reason,
               "method": engine.method, "stats": res.stats.as_dict()}
        if res.logprobs is not None:
            out["logprobs"] = [{"token": lp.token, "logprob": lp.logprob, "top": lp.top}
                               for lp in res.logprobs]
        click.echo(json.dumps(out))
        return
    for step in engine.stream(query, generation=c.generation, rules=rules):
        click.echo(step.text, nl=False)
    click.echo()
    click.echo(engine.last_stats.summary(), err=True)


def _fim_query(engine, prefix: str, suffix: str, c):
    """The FIM prompt's ids (``fim.py``) and the configs stopping where the middle ends."""
    from dataclasses import replace

    from .fim import encode_fim, fim_format

    ids = encode_fim(engine.target.tokenizer, prefix, suffix, engine.target.name)
    stop = fim_format(engine.target.tokenizer).stop
    return ids, (c._replace(generation=replace(c.generation, stop=c.generation.stop + stop))
                 if stop else c)


@main.command()
@options.click_options("bench")
@click.option("--prompts", "prompts_file", required=True, help="jsonl with 'turns' and 'category'")
@click.option("--methods", default="none,draft", show_default=True,
              help="comma-separated methods: " + ", ".join(NAMES) + "; METHOD@HEAD runs a "
                   "method that reads a head (" + ", ".join(readers("head")) + ") with HEAD: "
                   "'shipped', 'learned' or a head folder, as a row of its own, so one run "
                   "compares heads (eagle3@shipped,eagle3@learned)")
@click.option("--limit", default=None, type=int, help="use N prompts (round-robin over categories)")
@click.option("--json", "json_out", default=None, help="write the full report as JSON to this file")
@click.option("--plot", "plot_out", default=None,
              help="draw speedup and τ per method × category to this file (.png or .svg)")
@click.option("--raw", is_flag=True,
              help="send each prompt as raw text, not as a chat message (base models)")
@guarded
def bench(prompts_file, methods, limit, json_out, plot_out, raw, **kw):
    """Measure methods against plain decoding, in one process, over a prompts file.

    A method written METHOD@HEAD (eagle3@shipped,eagle3@learned) runs with that head, so one
    run compares heads; the --json report's env.heads names each method's head folder.
    """
    from . import bench as benchmod
    from .bench_plot import check_plot_path, plot_report
    from .config import GenerationConfig, ModelConfig, SamplingConfig
    from .targets import load

    v = options.values("bench", kw)
    model, sampling = options.config(ModelConfig, v), options.config(SamplingConfig, v)
    generation = options.config(GenerationConfig, v)
    names = benchmod.method_names(methods)
    for m in names:  # every method's settings are checked before anything is loaded
        options.spec_for(benchmod.bench_heads.split(m)[0], v)
    if plot_out:
        check_plot_path(plot_out)
    if limit is not None and limit < 1:
        raise EdgespecError(f"--limit must be >= 1, got {limit}")
    prompts = benchmod.load_prompts(prompts_file, limit=limit)
    target = load(model.model, dtype=model.dtype)
    report = benchmod.run_bench(target, names, prompts, generation=generation, sampling=sampling,
                                spec=v, prompts_file=prompts_file, raw=raw)
    if json_out:
        with open(json_out, "w") as f:
            json.dump(report, f, indent=2)
    if plot_out:
        plot_report(report, plot_out)
    click.echo(benchmod.report_markdown(report))


@main.command("make-draft")
@options.click_options("make-draft")
@click.option("--layers", required=True, type=int, help="keep the first N layers")
@click.option("--out", "out_dir", required=True, help="output model directory")
@guarded
def make_draft(layers, out_dir, **kw):
    """Write a draft model made of the target's first N layers, final norm and LM head."""
    from .loading.hub import resolve_model
    from .targets.derive import truncate_model

    model = options.configs("make-draft", kw).model.model
    path = truncate_model(resolve_model(model), layers, out_dir)
    click.echo(f"wrote {path} ({layers} layers of {model})")


class OneLineUsage(click.Command):
    """A command whose usage errors (unknown flag, bad value, missing option) are one line on
    stderr and exit status 2, like edgespec's own errors."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            _fail(e.format_message())


@main.command(cls=OneLineUsage)
@click.argument("kind", type=click.Choice(TRAIN_KINDS))
@train_settings.click_options
@guarded
def train(kind, **kw):
    """Train an EAGLE-3 or Medusa head, or count a corpus, for a model on this machine (resumable).

    KIND is eagle3, medusa or corpus. Data: --data prompts or questions the model writes
    itself, answered by the model; never the evaluation prompts. The head goes to --out; a
    corpus there for the same model gains this run's answers as one more source.
    """
    from .loading._blas import busy_openmp_threads
    from .training.recipe import run

    busy_openmp_threads()  # all MKL from here on: its threads may spin between products
    settings = train_settings.settings_from(kind, kw)
    run(settings, log=lambda line: click.echo(line, err=True))


@main.command()
@options.click_options("doctor")
@click.option("--json", "as_json", is_flag=True, help="print the findings as JSON")
@guarded
def doctor(as_json, **kw):
    """Report backend, BLAS, and forward timings (1 vs 8 tokens) and plain decoding speed."""
    from .doctor import format_findings, run_doctor

    model = options.configs("doctor", kw).model
    findings = run_doctor(model.model, model.dtype)
    click.echo(json.dumps(findings, indent=2) if as_json else format_findings(findings))


if __name__ == "__main__":
    main()
