"""Recording for learning through ``edgespec serve``: a chat request is recorded unless it sends
``store: false``; a server started with ``learn=False`` records nothing; ``store: true`` is a 400
naming the field; the serve command's learning flags reach the settings."""

from __future__ import annotations

import httpx
import pytest

from edgespec.learn.session import record_store
from edgespec.server import ServerSettings

from .live_server import LiveServer, assert_error


@pytest.fixture
def learning_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGESPEC_LEARN", raising=False)
    monkeypatch.setenv("EDGESPEC_LEARN_DIR", str(tmp_path / "learn"))
    return tmp_path / "learn"


def _chat(srv: LiveServer, **extra) -> httpx.Response:
    return httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
        "model": srv.state.model_name, "messages": [{"role": "user", "content": "the cat sat"}],
        "max_tokens": 12, "temperature": 0, **extra})


def _records(srv: LiveServer) -> list:
    srv.state.worker.learning.recorder.flush()
    return record_store(srv.state.target).records()


def test_a_chat_is_recorded_unless_it_sends_store_false(tiny_models, learning_dir):
    srv = LiveServer(ServerSettings(model=str(tiny_models.path())))
    try:
        assert srv.state.worker.learning is not None
        assert _chat(srv, store=False).status_code == 200
        assert _records(srv) == []
        r = _chat(srv)
        assert r.status_code == 200
        (rec,) = _records(srv)
        assert rec.answer_tokens == r.json()["usage"]["completion_tokens"]
        assert str(rec.path).startswith(str(learning_dir))
        assert_error(_chat(srv, store=True), 400, "store")
    finally:
        srv.stop()


def test_a_server_started_without_learning_records_nothing(tiny_models, learning_dir):
    srv = LiveServer(ServerSettings(model=str(tiny_models.path()), learn=False))
    try:
        assert srv.state.worker.learning is None
        assert _chat(srv).status_code == 200
        assert not learning_dir.exists()
    finally:
        srv.stop()


def test_serve_help_names_the_learning_flags_and_the_budget():
    from click.testing import CliRunner

    from edgespec.learn.store import DEFAULT_BUDGET_MB
    from edgespec.server.cli import serve

    text = CliRunner().invoke(serve, ["--help"]).output
    for flag in ("--no-learn", "--learn-budget-mb", "--learn-when-idle", "EDGESPEC_LEARN=0"):
        assert flag in text
    assert f"[default: {DEFAULT_BUDGET_MB}]" in text
