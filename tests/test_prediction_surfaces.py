"""Predicted outputs on every surface: the server's ``prediction`` field (official `openai`
client), ``llm.chat(..., prediction=)`` and ``edgespec generate --prediction FILE``. The output
is the same as without one; only the accepted / rejected prediction tokens are new."""

from __future__ import annotations

import json

import httpx
import pytest
from click.testing import CliRunner

import edgespec
from edgespec.cli import main
from edgespec.errors import ConfigError

from .live_server import HI, assert_error, chat
from .live_server import client, live, model_dir  # noqa: F401  (fixtures)


def test_server_prediction_changes_nothing_but_the_speed(client):
    plain = chat(client, max_tokens=40, extra_body={"method": "none"})
    text = plain.choices[0].message.content
    edited = text[:10] + "an inserted phrase" + text[14:]  # the answer differs from it a little
    for method, prediction in [("none", text), ("lookup", edited), ("draft", edited),
                               ("lookahead", [{"type": "text", "text": text[:20]},
                                              {"type": "text", "text": text[20:]}])]:
        r = chat(client, max_tokens=40, prediction={"type": "content", "content": prediction},
                 extra_body={"method": method})
        assert r.choices[0].message.content == text, method
        details = r.usage.completion_tokens_details
        # (the random model's bytes need not re-encode to the same ids: some are drafted)
        assert details.accepted_prediction_tokens > 0, method
        assert r.usage.model_extra["speculative"]["method"].startswith("prediction"), method
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0


def test_server_refuses_other_prediction_types(live):
    url = live.url + "/v1/chat/completions"
    body = {"messages": HI, "max_tokens": 4}
    r = httpx.post(url, json={**body, "prediction": {"type": "diff", "content": "x"}})
    assert "'content'" in assert_error(r, 400, param="prediction.type")["message"]
    r = httpx.post(url, json={**body, "prediction": {"type": "content", "content": 3}})
    assert assert_error(r, 400)["param"].startswith("prediction")
    r = httpx.post(url, json={**body, "prediction": "just text"})
    assert_error(r, 400, param="prediction")


@pytest.fixture(scope="module")
def llm(model_dir):
    with edgespec.load(str(model_dir), progress=False, method="lookup") as loaded:
        yield loaded


def test_python_api_prediction(llm):
    plain = llm.chat(HI, max_tokens=40, temperature=0)
    for prediction in (plain.text, {"type": "content", "content": plain.text[5:]}):
        r = llm.chat(HI, max_tokens=40, temperature=0, prediction=prediction)
        assert r.token_ids == plain.token_ids
        # (the random model's bytes need not re-encode to the same ids: some are drafted)
        assert r.stats.accepted_prediction_tokens > 0 and r.stats.method == "prediction+lookup"
    with pytest.raises(ConfigError, match="prediction type must be 'content'"):
        llm.chat(HI, prediction={"type": "diff", "content": "x"})
    with pytest.raises(ConfigError, match="prediction must be text"):
        llm.complete("the cat", prediction=[1, 2])


def test_cli_generate_prediction(model_dir, tmp_path):
    run = CliRunner().invoke
    args = ["generate", "--model", str(model_dir), "--temperature", "0", "--max-tokens", "30",
            "--json", "the cat sat on the mat"]
    plain = json.loads(run(main, [*args, "--method", "none"]).output)
    predicted = tmp_path / "answer.txt"
    predicted.write_text(plain["text"], encoding="utf-8")
    res = run(main, [*args, "--prediction", str(predicted)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["token_ids"] == plain["token_ids"]
    assert out["stats"]["accepted_prediction_tokens"] > 0
    bad = run(main, [*args, "--prediction", str(tmp_path / "missing.txt")])
    assert bad.exit_code == 2 and "missing.txt" in bad.output
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    bad = run(main, [*args, "--prediction", str(tmp_path / "latin1.txt")])
    assert bad.exit_code == 2 and "not UTF-8" in bad.output
