"""The demo model (SmolLM2-135M-Instruct): draft-model speculation is exact on MT-bench prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import edgespec
from edgespec import Engine, SamplingConfig, SpecConfig
from edgespec.loading.hub import resolve_model
from edgespec.targets.derive import truncate_model

pytestmark = pytest.mark.demo

# the held-out evaluation prompts live outside the repository, next to it
MT_BENCH = Path(__file__).resolve().parents[2] / "shared" / "eval" / "mt_bench.jsonl"


def _prompts(n: int) -> list[str]:
    if not MT_BENCH.is_file():
        pytest.skip(f"MT-bench prompts not found at {MT_BENCH} (outside the repository)")
    rows = [json.loads(line) for line in MT_BENCH.read_text().splitlines() if line.strip()]
    by_category = {}
    for r in rows:
        by_category.setdefault(r["category"], r["turns"][0])
    return list(by_category.values())[:n]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    target = edgespec.load_target("demo", progress=False)
    draft_dir = truncate_model(resolve_model("demo", progress=False), 4,
                               tmp_path_factory.mktemp("d") / "draft4")
    return target, edgespec.load_target(str(draft_dir), progress=False)


def test_draft_model_matches_plain_greedy_on_mt_bench(demo):
    target, draft = demo
    plain = Engine(target)
    spec = Engine(target, edgespec.make_drafter(SpecConfig(method="draft", draft="x", num_draft=4),
                                                target, SamplingConfig(), draft=draft))
    for prompt in _prompts(3):
        msgs = [{"role": "user", "content": prompt}]
        a = plain.generate(msgs, max_tokens=32)
        b = spec.generate(msgs, max_tokens=32)
        assert b.token_ids == a.token_ids, prompt
        assert b.stats.proposed > 0


def test_demo_model_answers_a_question(demo):
    target, _ = demo
    answer = Engine(target).generate([{"role": "user", "content": "What is the capital of France?"}],
                                     max_tokens=16)
    assert "Paris" in answer.text
