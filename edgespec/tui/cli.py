"""``edgespec chat [MODEL]``: the Textual chat app, or the line-based chat when stdin or stdout is
not a terminal (or with ``--plain``). Registered on the main group by ``edgespec/cli.py``.
"""

from __future__ import annotations

import os
import sys
import click

from .. import options
from ..learn.flags import learn_options, learning_from
from ..cli import guarded
from ..config import ModelConfig, SamplingConfig
from ..errors import EdgespecError
from .session import aopen_session, open_session


@click.command("chat")
@click.argument("model_ref", metavar="[MODEL]", default=ModelConfig.model, required=False)
@options.click_options("chat")
@click.option("--system", default=None, help="system message for the conversation")
@click.option("--plain", is_flag=True,
              help="line-based chat (automatic when stdin or stdout is not a terminal)")
@click.option("--color", type=click.Choice(["auto", "always", "never"]), default="auto",
              show_default=True, help="colour accepted-draft tokens in line mode "
              "(auto: when stdout is a terminal and NO_COLOR is unset)")
@learn_options
@guarded
def chat(model_ref, system, plain, color, learn, learn_budget_mb, learn_when_idle, **kw):
    """Chat with MODEL (HF repo id, local dir, .gguf file; default: the demo model), seeing
    which tokens the target accepted from the drafter, live.

    Sampling: the flags given, else the model's generation_config.json where it sets any,
    else the chat's defaults (shown with each flag below); --temp 0 is greedy."""
    c = options.configs("chat", kw)  # MODEL is an argument here, not an option; checks every value
    given = options.given("chat", kw)
    opened = dict(spec=c.spec, generation=c.generation, system=system, dtype=c.model.dtype,
                  sampling=options.pick(SamplingConfig, given),  # over the model's, the chat's
                  method_named="method" in given,
                  learning=learning_from("chat", learn, learn_budget_mb, learn_when_idle))
    if plain or not (sys.stdin.isatty() and sys.stdout.isatty()):
        from .plain import run_plain

        on = color == "always" or (color == "auto" and sys.stdout.isatty()
                                   and not os.environ.get("NO_COLOR"))
        sys.exit(run_plain(lambda: open_session(model_ref, status=_to_stderr, **opened), color=on))
    from .app import ChatApp

    app = ChatApp(lambda status: aopen_session(model_ref, status=status, **opened), model_ref)
    app.run()
    if app.load_error:
        raise EdgespecError(app.load_error)
    sys.exit(app.return_code or 0)


def _to_stderr(line: str) -> None:
    click.echo(line, err=True)


if __name__ == "__main__":
    chat()
