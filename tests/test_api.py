"""The Python API (``edgespec.load`` -> ``LLM``) on a tiny random model that is also its own
draft model (the self-draft oracle: every draft is accepted, greedy output is unchanged).

References come from a plain ``Engine`` on the LLM's own target, built fresh (no cache carried
over) and run while the LLM is idle: every API path must give exactly its tokens.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from click.testing import CliRunner

import edgespec
from edgespec import ConfigError, Engine, SamplingConfig
from edgespec.cli import main
from edgespec.config import METHODS
from edgespec.errors import UnavailableError

HI = [{"role": "user", "content": "the cat sat on the mat"}]
PROMPTS = [f"tell me about {w}" for w in ("cats", "the sea", "a mat", "then", "hats", "tea",
                                          "the rain", "a net")]


@pytest.fixture(scope="module")
def model_dir(tiny_models):
    return tiny_models.path(context=2048, tie=False)  # untied: says varied things


@pytest.fixture(scope="module")
def llm(model_dir):
    with edgespec.load(str(model_dir), draft=str(model_dir), progress=False) as llm:
        yield llm


@pytest.fixture
def endless(llm):
    """No EOS for the test's duration: a call runs until its token limit or a cancel."""
    eos = llm.target.tokenizer.eos_token_ids
    llm.target.tokenizer.eos_token_ids = frozenset()
    yield llm
    llm.target.tokenizer.eos_token_ids = eos


def reference(llm, prompt, n: int, temperature: float = 0.0, seed: int | None = None) -> list[int]:
    """Plain decoding of ``prompt`` (chat messages, or a str as one user message), from scratch."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    engine = Engine(llm.target, sampling=SamplingConfig(temperature=temperature, seed=seed),
                    reuse_prefix=False)
    return engine.generate(messages, max_tokens=n).token_ids


def test_sync_stream_and_async_give_the_same_tokens_greedy(llm):
    expected = reference(llm, HI, 24)
    result = llm.chat(HI, max_tokens=24)
    assert result.token_ids == expected and result.stats.method == "draft"
    assert result.stats.tau > 1 and result.finish_reason in ("length", "stop")
    stream = llm.stream(HI, max_tokens=24)
    steps = list(stream)
    assert [t for s in steps for t in s.token_ids] == expected
    assert stream.result().text == "".join(s.text for s in steps) == result.text

    async def both():
        answer = await llm.achat(HI, max_tokens=24)
        steps = [s async for s in llm.astream(HI, max_tokens=24)]
        return answer, steps

    answer, steps = asyncio.run(both())
    assert answer.token_ids == expected == [t for s in steps for t in s.token_ids]


def test_segments_mark_the_accepted_drafts(llm):
    steps = list(llm.stream(HI, max_tokens=24, method="draft", num_draft=3))
    segments = [seg for s in steps for seg in s.segments]
    assert "".join(seg.text for seg in segments) == "".join(s.text for s in steps)
    assert {seg.drafted for seg in segments} == {True, False}
    plain = [seg for s in llm.stream(HI, max_tokens=8, method="none") for seg in s.segments]
    assert not any(seg.drafted for seg in plain)


def test_a_string_is_one_user_message_like_the_cli_and_complete_is_raw(llm, model_dir):
    out = CliRunner().invoke(main, ["generate", "--model", str(model_dir), "--json",
                                    "--max-tokens", "16", "the cat"], catch_exceptions=False)
    cli = json.loads(out.output.strip().splitlines()[-1])
    assert llm.chat("the cat", max_tokens=16).token_ids == cli["token_ids"]
    raw = llm.complete("the cat", max_tokens=16)
    ids = llm.target.tokenizer.encode("the cat")
    assert raw.token_ids == Engine(llm.target, reuse_prefix=False).generate(ids, max_tokens=16).token_ids
    assert llm.complete(ids, max_tokens=16).token_ids == raw.token_ids != cli["token_ids"]


def test_eight_concurrent_achat_calls_equal_their_solo_runs(llm):
    """Different prompts, methods and sampling settings at once: each call gets its own output."""
    calls = [dict(method=m, max_tokens=12) for m in ("none", "lookup", "draft", "auto")] * 2
    calls[5].update(temperature=1.0, seed=11)
    calls[6].update(temperature=0.7, seed=3, top_k=20)
    solo = [llm.chat(p, **kw) for p, kw in zip(PROMPTS, calls)]

    async def together():
        return await asyncio.gather(*(llm.achat(p, **kw) for p, kw in zip(PROMPTS, calls)))

    for alone, concurrent in zip(solo, asyncio.run(together())):
        assert concurrent.token_ids == alone.token_ids and concurrent.text == alone.text
    for p, kw, alone in zip(PROMPTS, calls, solo):
        if "temperature" not in kw:
            assert alone.token_ids == reference(llm, p, 12)


def test_cancel_mid_stream_then_a_new_call_is_correct(endless):
    llm = endless
    stream = llm.stream("once upon a time", max_tokens=1500)
    for i, _ in enumerate(stream):
        if i == 2:
            stream.cancel()
    cut = stream.result()
    assert cut.finish_reason == "cancelled" and 3 <= len(cut.token_ids) < 1500
    assert llm.chat(HI, max_tokens=20).token_ids == reference(llm, HI, 20)
    left = llm.stream("once upon a time", max_tokens=1500)
    for _ in left:
        break  # leaving the loop cancels the call
    assert left.result().finish_reason == "cancelled"
    assert llm.chat(HI, max_tokens=20).token_ids == reference(llm, HI, 20)


def test_cancel_from_another_thread_and_from_an_asyncio_task(endless):
    llm = endless
    started, results = threading.Event(), []

    def run():
        stream = llm.stream("far away", max_tokens=1500)
        for _ in stream:
            started.set()
        results.append(stream.result())

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(30)
    llm.cancel()
    thread.join(30)
    assert results[0].finish_reason == "cancelled" and len(results[0].token_ids) < 1500

    async def cancel_task():
        # cancelled while queued or just started: a fixed sleep raced a fast machine finishing
        # all 1500 tokens first, so each cancel here waits on an event, not on the clock
        task = asyncio.create_task(llm.achat("far away", max_tokens=1500))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        first_step = asyncio.Event()

        async def consume():
            stream = llm.astream("far away", max_tokens=1500)
            async for _ in stream:
                first_step.set()
            return await stream.result()

        task = asyncio.create_task(consume())
        await first_step.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await llm.achat(HI, max_tokens=20)

    assert asyncio.run(cancel_task()).token_ids == reference(llm, HI, 20)


def test_multi_turn_reuses_the_prompt_cache(llm):
    messages = [*HI]
    first = llm.chat(messages, max_tokens=12)
    messages += [{"role": "assistant", "content": first.text},
                 {"role": "user", "content": "and then?"}]
    second = llm.chat(messages, max_tokens=12)
    assert second.stats.cached_tokens >= first.stats.prompt_tokens - 1
    assert second.token_ids == reference(llm, messages, 12)


def test_switching_the_method(llm):
    assert llm.method == "draft"  # the default with a draft model; then every method can run
    assert llm.methods == tuple(m for m in METHODS  # no head, no MTP layer
                                if m not in ("eagle3", "medusa", "corpus", "mtp"))
    llm.method = "lookup"
    try:
        assert llm.chat(HI, max_tokens=12).stats.method == "lookup"
        assert llm.chat(HI, max_tokens=12, method="none").stats.method == "none"
        assert llm.method == "lookup"
    finally:
        llm.method = "draft"


def test_bad_options_raise_config_error_naming_them_and_what_is_allowed(llm, model_dir):
    with pytest.raises(ConfigError, match="unknown method 'magic'; choose one of: none, lookup, draft"):
        llm.chat(HI, method="magic")
    with pytest.raises(ConfigError, match=r"temperature must be a number in \[0, 100\], got -1"):
        llm.chat(HI, temperature=-1)
    with pytest.raises(ConfigError, match="unknown option 'tempreature'; the options are: method, "):
        llm.chat(HI, tempreature=0.5)
    with pytest.raises(ConfigError, match="draft is loaded once, with the model"):
        llm.chat(HI, draft="other")
    with pytest.raises(ConfigError, match="exit_layer applies to method 'early-exit' only"):
        llm.chat(HI, method="lookup", exit_layer=1)
    with pytest.raises(ConfigError, match="chat takes a list of"):
        llm.chat([1, 2, 3])
    with pytest.raises(ConfigError, match="unknown method 'magic'"):
        llm.method = "magic"
    with pytest.raises(ConfigError, match="num_draft must be an integer in \\[1, 64\\], got 0"):
        edgespec.load(str(model_dir), num_draft=0)  # before anything is loaded
    with pytest.raises(ConfigError, match="method 'draft' needs a draft model: pass draft=REF"):
        edgespec.load(str(model_dir), method="draft", progress=False)
    assert llm.chat(HI, max_tokens=4).finish_reason  # still serving


def test_help_lists_the_public_names_and_options():
    assert {"LLM", "load", "load_target", "Stream", "AsyncStream", "Result", "Step",
            "ConfigError"} <= set(edgespec.__all__)
    public: dict = {}
    exec("from edgespec import *", public)  # every name in __all__ resolves
    assert set(edgespec.__all__) <= set(public) and public["load"] is edgespec.load
    for option in ("method:", "num_draft:", "temperature:", "max_tokens:", "stop:"):
        assert option in edgespec.load.__doc__


def test_a_closed_llm_says_so(model_dir):
    llm = edgespec.load(str(model_dir), method="none", progress=False)
    assert llm.chat("hi", max_tokens=3).token_ids
    llm.close()
    with pytest.raises(UnavailableError):
        llm.chat("hi", max_tokens=3)
