"""logprobs: the raw model distribution at each emitted position, whatever drafted the tokens.

- Every method of ``test_lossless.DRAFTERS`` (all the registry's methods that run on a tiny
  model, and the head drafters with oracle heads) reports, for greedy output, the same values
  and the same alternatives as plain decoding, within 1e-4; plain decoding's values are the
  log-softmax of the target's logits computed from scratch.
- Under sampling and penalties the values are still the raw model's (from scratch).
- The server returns OpenAI's shapes, and the official client parses them: chat (whole and
  streamed, the streamed chunks' entries equal to the whole), completions, and the errors.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from edgespec import Engine, SamplingConfig
from edgespec.errors import ConfigError

from .live_server import HI, assert_error, chat
from .live_server import client, live, model_dir  # noqa: F401  (fixtures)
from .test_lossless import CFG, DRAFTERS, MODEL, prompt_ids
from .tiny import logits_from_scratch

TOP = 5
TOL = 1e-4


@pytest.fixture(scope="module")
def setup(tiny_models):
    target = tiny_models.load(**MODEL)
    draft = tiny_models.load(**{**MODEL, "scale": 1.3})
    return target, draft, prompt_ids(target)


def from_scratch(target, ids, tokens) -> np.ndarray:
    """(len(tokens), V) log-softmax of the target's rows before each token, computed naively."""
    x = logits_from_scratch(target, ids + tokens[:-1])[len(ids) - 1 :].astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def assert_same(got, want):
    assert [lp.token for lp in got] == [lp.token for lp in want]
    np.testing.assert_allclose([lp.logprob for lp in got], [lp.logprob for lp in want], atol=TOL)
    for g, w in zip(got, want):
        assert [t for t, _ in g.top] == [t for t, _ in w.top]
        np.testing.assert_allclose([v for _, v in g.top], [v for _, v in w.top], atol=TOL)


@pytest.fixture(scope="module")
def plain(setup):
    target, _, ids = setup
    res = Engine(target).generate(ids, max_tokens=16, logprobs=TOP)
    return res


def test_plain_logprobs_are_the_raw_model_distribution(setup, plain):
    target, _, ids = setup
    ref = from_scratch(target, ids, plain.token_ids)
    lps = plain.logprobs
    assert len(lps) == len(plain.token_ids) == 16
    for i, lp in enumerate(lps):
        assert abs(lp.logprob - ref[i, lp.token]) < TOL
        best = np.argsort(-ref[i])[:TOP]
        assert [t for t, _ in lp.top] == best.tolist()
        np.testing.assert_allclose([v for _, v in lp.top], ref[i, best], atol=TOL)
    assert all(s.logprobs is not None and len(s.logprobs) == len(s.token_ids) for s in plain.steps)


def test_the_pipelined_and_the_step_loop_plain_decoding_agree(setup, plain):
    target, _, ids = setup
    steps = Engine(target, pipeline=False).generate(ids, max_tokens=16, logprobs=TOP)
    assert steps.token_ids == plain.token_ids
    assert_same(steps.logprobs, plain.logprobs)


@pytest.mark.parametrize("method", list(DRAFTERS))
def test_every_method_reports_what_plain_decoding_reports(setup, plain, method):
    target, draft, ids = setup
    greedy = SamplingConfig()
    res = Engine(target, DRAFTERS[method](target, draft, greedy), greedy).generate(
        ids, max_tokens=16, logprobs=TOP)
    assert res.token_ids == plain.token_ids
    assert_same(res.logprobs, plain.logprobs)
    if method != "none":  # the values came from the rows of a drafted tree
        assert res.stats.proposed > 0


@pytest.mark.parametrize("method", ["draft", "eagle3", "lookahead"])
def test_sampled_and_penalised_tokens_get_the_raw_values(setup, method):
    target, draft, ids = setup
    cfg = SamplingConfig(**CFG, seed=3, frequency_penalty=0.5, presence_penalty=0.5)
    res = Engine(target, DRAFTERS[method](target, draft, cfg), cfg).generate(
        ids, max_tokens=12, logprobs=0)
    ref = from_scratch(target, ids, res.token_ids)
    got = [lp.logprob for lp in res.logprobs]
    np.testing.assert_allclose(got, ref[np.arange(len(got)), res.token_ids], atol=TOL)
    assert all(lp.top == () for lp in res.logprobs)


def test_bad_logprobs_are_refused(setup):
    target, _, ids = setup
    for bad in (21, -1, True, 2.0):
        with pytest.raises(ConfigError, match="logprobs must be an integer in \\[0, 20\\]"):
            list(Engine(target).stream(ids, max_tokens=2, logprobs=bad))


# --- the server -------------------------------------------------------------------------------

def _entries(choice_logprobs) -> list:
    return [(e.token, e.logprob, e.bytes, [(t.token, t.logprob) for t in e.top_logprobs])
            for e in choice_logprobs.content]


def test_chat_logprobs_whole_and_streamed_and_the_same_for_every_method(client):
    asked = {"max_tokens": 12, "logprobs": True, "top_logprobs": 3}
    plain = chat(client, **asked, extra_body={"method": "none"})
    choice = plain.choices[0]
    entries = _entries(choice.logprobs)
    assert len(entries) == plain.usage.completion_tokens == 12
    assert all(len(top) == 3 and top[0][1] >= top[-1][1] for *_, top in entries)
    text = bytes(b for e in entries for b in e[2]).decode("utf-8", "replace")
    assert text == choice.message.content
    for method in ("draft", "lookup"):
        spec = chat(client, **asked, extra_body={"method": method})
        got = _entries(spec.choices[0].logprobs)
        assert [e[0] for e in got] == [e[0] for e in entries]
        np.testing.assert_allclose([e[1] for e in got], [e[1] for e in entries], atol=TOL)
    chunks = list(chat(client, **asked, stream=True, extra_body={"method": "draft"}))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in _entries(c.choices[0].logprobs)]
    assert [e[0] for e in streamed] == [e[0] for e in entries]
    np.testing.assert_allclose([e[1] for e in streamed], [e[1] for e in entries], atol=TOL)
    assert chat(client, max_tokens=4).choices[0].logprobs is None  # not asked: null


def test_completion_logprobs(client):
    r = client.completions.create(model="gpt-4o-mini", prompt="the cat sat", max_tokens=10,
                                  temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 10
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 2 <= len(top) <= 3 and top[tok] == value  # the chosen token is among them
        assert value <= max(top.values())
    chunks = list(client.completions.create(model="gpt-4o-mini", prompt="the cat sat",
                                            max_tokens=10, temperature=0, logprobs=2, stream=True))
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [o for p in parts for o in p.text_offset] == lp.text_offset  # continued across chunks
    np.testing.assert_allclose([v for p in parts for v in p.token_logprobs], lp.token_logprobs,
                               atol=TOL)


def test_logprobs_errors(live):
    url = live.url + "/v1"
    r = httpx.post(url + "/chat/completions",
                   json={"messages": HI, "logprobs": True, "top_logprobs": 21})
    assert_error(r, 400, param="top_logprobs")
    r = httpx.post(url + "/chat/completions", json={"messages": HI, "top_logprobs": 2})
    assert_error(r, 400, param="top_logprobs")
    r = httpx.post(url + "/completions", json={"prompt": "x", "logprobs": 21})
    assert_error(r, 400, param="logprobs")
    r = httpx.post(url + "/chat/completions", json={"messages": HI, "logprobs": "yes"})
    assert_error(r, 400)


def test_python_api_logprobs(model_dir):
    import edgespec

    with edgespec.load(str(model_dir), draft=str(model_dir), progress=False) as llm:
        plain = llm.complete("the cat sat", max_tokens=8, method="none", logprobs=2)
        spec = llm.complete("the cat sat", max_tokens=8, method="draft", logprobs=2)
        assert spec.token_ids == plain.token_ids and len(plain.logprobs) == 8
        assert_same(spec.logprobs, plain.logprobs)
        assert llm.complete("the cat sat", max_tokens=2).logprobs is None
        with pytest.raises(ConfigError, match="logprobs must be"):
            llm.complete("the cat sat", logprobs=30)


def test_cli_logprobs_and_penalties(model_dir):
    import json

    from click.testing import CliRunner

    from edgespec.cli import main

    def gen(*extra):
        r = CliRunner().invoke(main, ["generate", "--model", str(model_dir), "--json", "--raw",
                                      "--max-tokens", "6", *extra, "the cat sat"])
        return r.exit_code, r.output

    code, out = gen("--method", "lookup", "--logprobs", "2", "--frequency-penalty", "1.5")
    assert code == 0, out
    got = json.loads(out.strip().splitlines()[-1])
    assert [lp["token"] for lp in got["logprobs"]] == got["token_ids"]
    assert all(len(lp["top"]) == 2 for lp in got["logprobs"])
    code, out = gen("--logprobs", "21")
    assert code != 0 and "--logprobs must be an integer in [0, 20]" in out
    code, out = gen("--repetition-penalty", "0")
    assert code != 0 and "repetition_penalty must be a number in (0, 10]" in out
