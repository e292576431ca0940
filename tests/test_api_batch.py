"""The Python API batches: ``chat_many`` and concurrent ``achat`` calls decode together on the
one generation thread, and each answer is exactly what the call gets alone."""

from __future__ import annotations

import asyncio

import pytest

import edgespec
from edgespec.errors import ConfigError

from .tiny import make_tiny_model

QUESTIONS = ["the cat", "a mat on the", "the the cat sat", "in the end"]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("api_batch")
    make_tiny_model(path, layers=2, seed=3, tie=False)
    with edgespec.load(str(path), method="lookup", progress=False, max_concurrency=3) as llm:
        yield llm


def test_chat_many_answers_each_as_alone(llm):
    alone = [llm.chat(q, max_tokens=10) for q in QUESTIONS]
    together = llm.chat_many(QUESTIONS, max_tokens=10)
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert [r.text for r in together] == [r.text for r in alone]
    seeded = dict(max_tokens=10, temperature=1.0, seed=4)
    one = llm.chat(QUESTIONS[1], **seeded)
    assert llm.chat_many([QUESTIONS[0], QUESTIONS[1]], **seeded)[1].token_ids == one.token_ids


def test_concurrent_achat_calls_share_the_batch(llm):
    alone = [llm.chat(q, max_tokens=10, method=m).token_ids
             for q, m in zip(QUESTIONS, ["lookup", "none", "lookup", "none"])]

    async def gathered():
        return await asyncio.gather(*(llm.achat(q, max_tokens=10, method=m) for q, m in
                                      zip(QUESTIONS, ["lookup", "none", "lookup", "none"])))

    assert [r.token_ids for r in asyncio.run(gathered())] == alone


def test_bad_arguments_are_named():
    with pytest.raises(ConfigError, match="max_concurrency"):
        edgespec.load("demo", max_concurrency=0)
    with pytest.raises(ConfigError, match="chat_many takes a list"):
        edgespec.LLM.chat_many(object.__new__(edgespec.LLM), "one question")
