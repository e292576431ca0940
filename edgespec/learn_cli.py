"""``edgespec learn``: what edgespec has learned from this user, and the commands over it.

    status    what is recorded (where, how much, how old), which learned heads are in use,
              which were kept aside and why, the last run
    run       fine-tune the EAGLE-3 head on the records now (``learn/run.py``), within --budget
    rollback  go back to the head in use before the current learned one
    forget    delete everything learned for the model (records, corpus, heads, training state)

Contract: each takes the model as ``--model`` (default the demo model) since what is learned is
kept per target (by fingerprint); errors are one line and exit status 2 (``cli.guarded``).
"""

from __future__ import annotations

import json
import shutil

import click

from .cli import guarded
from .errors import ConfigError
from .training.settings import parse_duration


def _model_options(fn):
    fn = click.option("--dtype", default=None,
                      help="the dtype the model is served in (as given to chat/serve)")(fn)
    return click.option("--model", default="demo", show_default=True,
                        help="the model whose learning this is (HF repo id, dir, .gguf, demo)")(fn)


def _target(model: str, dtype: str | None):
    from .targets import load

    return load(model, dtype=dtype, progress=False)


@click.group("learn")
def learn() -> None:
    """Learn from your own use: the drafter fits what you ask. Everything stays on this machine."""


@learn.command()
@_model_options
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON")
@guarded
def status(model, dtype, as_json):
    """What is recorded and learned for MODEL."""
    from .learn.status import describe, status_of

    info = status_of(_target(model, dtype))
    click.echo(json.dumps(info, indent=1) if as_json else describe(info))


@learn.command()
@_model_options
@click.option("--budget", default="20m", show_default=True,
              help="time to spend, e.g. 900, 20m, 1.5h (replay data, training and the guard)")
@click.option("--json", "json_out", default=None, help="also write the run's report to this file")
@guarded
def run(model, dtype, budget, json_out):
    """Fine-tune the EAGLE-3 head on what was recorded, then use it only if it accepts more on
    your held-out recent history. A run cut short (Ctrl+C, kill) resumes from its checkpoint."""
    from .learn.run import LearnSettings, run as learn_run
    from .learn.status import describe_run

    seconds = parse_duration(budget)
    target = _target(model, dtype)
    if target.path is None:
        raise ConfigError(f"model {model!r} has no folder on disk to make replay data from")
    report = learn_run(target, target.path, LearnSettings(budget_s=seconds),
                       log=lambda m: click.echo(m, err=True))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(report, f, indent=1)
    click.echo(describe_run(report))


@learn.command()
@_model_options
@click.option("--kind", type=click.Choice(["eagle3", "corpus"]), default="eagle3",
              show_default=True, help="which learned head to roll back")
@guarded
def rollback(model, dtype, kind):
    """Use the head that was in use before the current learned one again."""
    from .heads.config import fingerprint
    from .learn.versions import rollback as roll

    left, now = roll(fingerprint(_target(model, dtype)), kind)
    click.echo(f"rolled back {left}; in use now: {now or 'the shipped ' + kind + ' head'}")


@learn.command()
@_model_options
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@guarded
def forget(model, dtype, yes):
    """Delete everything learned for MODEL: recordings, corpus, learned heads, training state."""
    from .heads.config import fingerprint
    from .heads.learned import target_dir
    from .learn.status import folder_bytes

    root = target_dir(fingerprint(_target(model, dtype)))
    if not root.exists():
        click.echo(f"nothing learned for {model} ({root} does not exist)")
        return
    size = folder_bytes(root)
    if not yes:
        click.confirm(f"delete {root} ({size / 2**20:.1f} MiB: recordings, corpus, learned "
                      "heads, training state)?", abort=True)
    shutil.rmtree(root)
    click.echo(f"deleted {root} ({size / 2**20:.1f} MiB); the shipped heads are in use")
