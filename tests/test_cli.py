"""The `edgespec` command end to end on tiny models: output, JSON shape, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from edgespec.cli import main


@pytest.fixture(scope="module")
def models(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    target = tiny_models.path(layers=4, context=256)
    other = tiny_models.path(extra_tokens=("zzz", "yyy"))
    return {"target": str(target), "other": str(other), "root": root}


def run(*args):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def gen_json(model, *extra):
    code, out = run("generate", "--model", model, "--json", "--max-tokens", "16", *extra,
                    "the cat sat on the mat")
    assert code == 0, out
    return json.loads(out.strip().splitlines()[-1])


def test_generate_json_shape(models):
    out = gen_json(models["target"], "--method", "none")
    assert set(out) >= {"text", "token_ids", "stats", "finish_reason"}
    for key in ("tau", "acceptance_rate", "proposed", "accepted", "target_forwards",
                "tokens_per_s", "draft_s", "verify_s", "peak_memory_mb"):
        assert key in out["stats"]
    assert len(out["token_ids"]) == 16 and out["stats"]["tau"] == 1.0


def test_make_draft_and_draft_method_match_plain(models):
    draft_dir = models["root"] / "draft2"
    code, out = run("make-draft", "--model", models["target"], "--layers", "2", "--out", str(draft_dir))
    assert code == 0, out
    plain = gen_json(models["target"])
    spec = gen_json(models["target"], "--method", "draft", "--draft", str(draft_dir), "--num-draft", "3")
    assert spec["token_ids"] == plain["token_ids"]
    assert spec["stats"]["proposed"] > 0
    oracle = gen_json(models["target"], "--method", "draft", "--draft", models["target"])
    assert oracle["token_ids"] == plain["token_ids"] and oracle["stats"]["acceptance_rate"] == 1.0


def test_num_draft_above_the_default_max_draft(models):
    plain = gen_json(models["target"])
    out = gen_json(models["target"], "--method", "lookup", "--num-draft", "16")
    assert out["token_ids"] == plain["token_ids"]
    code, text = run("generate", "--model", models["target"], "--num-draft", "16", "--max-draft",
                     "8", "hi")
    assert code == 2 and "--max-draft" in text and "8" in text


def test_plain_streaming_output(models):
    code, out = run("generate", "--model", models["target"], "--max-tokens", "8", "--raw", "hello")
    assert code == 0 and "tok/s" in out


@pytest.mark.parametrize("args, needle", [
    (["generate", "--model", "{target}", "   "], "prompt is empty"),
    (["generate", "--model", "{target}", "--max-tokens", "0", "hi"], "max_tokens"),
    (["generate", "--model", "{target}", "--temp", "-1", "hi"], "temperature"),
    (["generate", "--model", "{target}", "--temperature", "-1", "hi"], "temperature"),
    (["generate", "--model", "{target}", "--method", "lookup", "--exit-layer", "2", "hi"], "early-exit"),
    (["generate", "--model", "{target}", "--top-p", "1.5", "hi"], "top_p"),
    (["generate", "--model", "/no/such/model", "hi"], "/no/such/model"),
    (["generate", "--model", "{target}", "--method", "draft", "hi"], "draft"),
    (["generate", "--model", "{target}", "--method", "draft", "--draft", "{other}", "hi"], "vocabulary"),
    (["generate", "--model", "{target}", "--raw", "word " * 300], "context window"),
    (["make-draft", "--model", "{target}", "--layers", "9", "--out", "{root}/x"], "--layers"),
])
def test_bad_input_is_one_line_and_nonzero(models, args, needle):
    args = [a.format(**models) for a in args]
    code, out = run(*args)
    assert code != 0
    assert needle in out
    assert "Traceback" not in out


def test_unknown_method_is_a_usage_error(models):
    code, out = run("generate", "--model", models["target"], "--method", "bogus", "hi")
    assert code == 2 and "bogus" in out


def test_real_process_error_has_no_traceback(models):
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "edgespec.cli", "generate", "--model",
                           "/no/such/dir", "hello"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "/no/such/dir" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
