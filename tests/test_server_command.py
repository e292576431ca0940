"""`edgespec serve` as a command: its options and errors, a real process answering on a port
and stopping on SIGINT, and the demo model behind the server."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import openai
import pytest
from click.testing import CliRunner

from edgespec.server import ServerSettings
from edgespec.server.cli import serve

from .live_server import LiveServer, chat
from .live_server import model_dir  # noqa: F401  (fixture)

# -- the command --------------------------------------------------------------------------------

def test_serve_command_options_and_errors(tmp_path):
    runner = CliRunner()
    out = runner.invoke(serve, ["--help"]).output
    for flag in ("--model", "--method", "--draft", "--num-draft", "--max-draft", "--dtype",
                 "--host", "--port", "--api-key", "--max-tokens-limit", "--cors-origin"):
        assert flag in out
    r = runner.invoke(serve, ["--model", str(tmp_path / "missing"), "--port", "0"])
    assert r.exit_code == 2 and "edgespec: error:" in r.output and "no such file" in r.output
    r = runner.invoke(serve, ["--model", "x", "--method", "draft", "--port", "0"])
    assert r.exit_code == 2 and "needs a draft model" in r.output
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = runner.invoke(serve, ["--model", "x", "--port", str(busy.getsockname()[1])])
    assert r.exit_code == 2 and "cannot listen" in r.output


def test_serve_command_end_to_end(model_dir):
    """The real command in a subprocess: load, print the URL, answer, stop on SIGINT."""
    code = "import edgespec; from edgespec.server.cli import serve; serve()"
    proc = subprocess.Popen([sys.executable, "-c", code, "--model", str(model_dir), "--port", "0",
                             "--model-alias", "gpt-4o-mini"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=os.getcwd())
    try:
        line = proc.stdout.readline()
        url = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line)
        assert url, line + proc.stderr.read() if proc.poll() is not None else line
        c = openai.OpenAI(base_url=url.group(1), api_key="x", max_retries=0, timeout=30)
        assert chat(c, max_tokens=3).usage.completion_tokens == 3
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(20)
    assert proc.returncode == 0, proc.stderr.read()


# -- the demo model ------------------------------------------------------------------------------

@pytest.mark.demo
def test_demo_model_chat():
    srv = LiveServer(ServerSettings(model="demo", max_tokens_limit=64, aliases=("gpt-4o-mini",)))
    try:
        r = chat(srv.client(), [{"role": "user", "content": "What is the capital of France?"}],
                 max_tokens=12)
        assert "Paris" in r.choices[0].message.content
        assert srv.health()["served"] == 1
    finally:
        srv.stop()
