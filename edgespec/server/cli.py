"""``edgespec serve``: the click command (registered by ``edgespec/cli.py``).

Contract: importing this module needs only click and edgespec's options; fastapi and uvicorn are
imported when the command runs, so the rest of the CLI starts without loading them. Errors
go through ``edgespec.cli.guarded`` (looked up when the command runs, so ``edgespec.cli`` can
import this module at any point). The model is loaded, with progress, before the socket is served;
the URL is printed once the port is bound. The model and speculation options are generated from
the config dataclasses (``options.SURFACES["serve"]``); they are every request's defaults.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import time

import click

from .. import options
from ..config import ModelConfig, SpecConfig
from ..errors import EdgespecError
from ..extras import missing_extra
from ..generation_defaults import describe
from ..kv_budget import KV_BUDGET_MB
from ..learn.flags import learn_options


def _guarded(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from ..cli import guarded

        return guarded(fn)(*args, **kwargs)

    return wrapper


@click.command("serve")
@options.click_options("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to bind (loopback unless you say otherwise)")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="port (0 = any free port)")
@click.option("--api-key", default=None, envvar="EDGESPEC_API_KEY",
              help="require 'Authorization: Bearer KEY' on /v1 [env: EDGESPEC_API_KEY]")
@click.option("--max-tokens-limit", default=2048, show_default=True, type=int,
              help="largest max_tokens a request may ask for (also the default)")
@click.option("--cors-origin", "cors_origins", multiple=True, metavar="ORIGIN",
              help="let web pages from ORIGIN (scheme://host[:port], e.g. http://localhost:5173) "
                   "call the API from a browser (repeatable; '*' for any origin)")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="another name requests may give in their Host header (repeatable; '*' for "
                   "any). Served without it: localhost, 127.0.0.1, [::1] and the --host address; "
                   "any other Host gets 403 (DNS-rebinding defence)")
@click.option("--model-alias", "aliases", multiple=True,
              help="another name requests may use for the served model (repeatable)")
@click.option("--no-prefix-reuse", is_flag=True,
              help="recompute every prompt instead of reusing the KV of the longest prefix a finished "
                   "request left (the prefix cache)")
@click.option("--max-concurrency", default=4, show_default=True, type=int,
              help="requests decoded at once, sharing each step's forward (continuous batching)")
@click.option("--max-queue", default=64, show_default=True, type=int,
              help="requests that may wait beyond those; one more gets 429 with Retry-After")
@click.option("--kv-budget-mb", default=KV_BUDGET_MB, show_default=True, type=int,
              help="KV cache memory, in MiB, of the requests decoding together; a request whose "
                   "prompt + max_tokens alone need more gets 413")
@learn_options
@_guarded
def serve(host, port, api_key, max_tokens_limit, cors_origins, allowed_hosts, aliases,
          no_prefix_reuse, max_concurrency, max_queue, kv_budget_mb, learn, learn_budget_mb,
          learn_when_idle, **kw):
    """Serve a model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions).

    The speculation options are every request's defaults; a request may name another available
    method and its own values (the same fields, without --draft). A request's unset sampling
    fields take the model's generation_config.json settings, else OpenAI's temperature 1."""
    try:
        import uvicorn

        from . import ServerSettings, ServerState, create_app
    except ImportError as e:
        raise missing_extra("edgespec serve", e) or e
    v = options.values("serve", kw)
    model, draft = options.config(ModelConfig, v).model, v.get("draft")
    settings = ServerSettings(
        model=model, method=options.given("serve", kw).get("method"), draft=draft,
        dtype=v.get("dtype"),
        spec_options=options.pick(SpecConfig, v, skip=("method", "draft")), api_key=api_key,
        max_tokens_limit=max_tokens_limit, cors_origins=tuple(cors_origins), host=host,
        allowed_hosts=tuple(allowed_hosts), aliases=tuple(aliases),
        reuse_prefix=not no_prefix_reuse, max_concurrency=max_concurrency, max_queue=max_queue,
        kv_budget_mb=kv_budget_mb, learn=learn, learn_budget_mb=learn_budget_mb,
        learn_when_idle=learn_when_idle)
    sock = _bind(host, port)  # before loading: a busy port fails in a second, not after the load
    click.echo(f"edgespec: loading {model}" + (f" (draft {draft})" if draft else ""), err=True)
    t0 = time.perf_counter()
    state = ServerState.start(settings)
    try:
        app = create_app(state)
        where = _url(host, sock.getsockname()[1])
        click.echo(f"edgespec: {state.model_name} loaded in {time.perf_counter() - t0:.1f} s; "
                   f"method {state.method} (available: {', '.join(state.methods)})", err=True)
        click.echo("edgespec: a request's unset sampling fields: " + (
            f"{describe(state.sampling)} (the model's generation_config.json)" if state.sampling
            else "temperature 1 (OpenAI's; the model's generation_config.json sets none)"),
            err=True)
        click.echo(_learning_line(state.worker.learning), err=True)
        if not _is_loopback(host) and not api_key:
            click.echo(f"edgespec: warning: listening on {host} without --api-key: anyone who can "
                       "reach this port can use the model", err=True)
        click.echo(f"edgespec: serving at {where}/v1 (OpenAI base_url); Ctrl+C to stop")
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:  # uvicorn re-raises the Ctrl+C it shut down on: a normal stop
            pass
        click.echo("edgespec: stopped", err=True)
    finally:
        state.stop()
        sock.close()


def _learning_line(learning) -> str:
    """Where recordings go (or that there are none), said once at start."""
    if learning is None:
        return "edgespec: learning off: nothing is recorded"
    where = learning.recorder.store.folder if learning.recorder else "the learn folder"
    idle = "; fine-tunes after a while without requests" if learning.when_idle else ""
    return (f"edgespec: learning on: recording features and tokens to {where} (this machine "
            f"only; --no-learn turns it off){idle}")


def _bind(host: str, port: int) -> socket.socket:
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise EdgespecError(f"cannot listen on {host}:{port}: {e.strerror or e}; "
                            "pick another --port (0 = any free port)") from e
    sock.set_inheritable(True)
    return sock


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
