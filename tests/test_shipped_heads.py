"""The heads shipped in models/ for the demo model: found for it, refused by other models, and
exact: greedy drafting with them gives plain decoding's tokens, with drafts accepted."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import edgespec
from edgespec import Engine, SamplingConfig, SpecConfig
from edgespec.heads import find_head, load_head
from edgespec.heads.corpus import load_corpus
from edgespec.training.exclusion import EvalExclusion, default_eval_dir

pytestmark = pytest.mark.demo

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "models" / "SmolLM2-135M-Instruct"
# training prompts only: never the held-out evaluation prompts
PROMPTS = ["Write a short note inviting a neighbour to a garden party on Saturday.",
           "Explain how a bicycle's gears make climbing a hill easier."]


@pytest.fixture(scope="module")
def demo():
    return edgespec.load_target("demo", progress=False)


KINDS = ["eagle3", "medusa", "corpus"]


@pytest.mark.parametrize("kind", KINDS)
def test_shipped_head_is_found_and_small(demo, kind):
    path = find_head(demo, kind)
    assert path is not None and Path(path).resolve() == (SHIPPED / kind).resolve()
    if kind == "corpus":
        assert load_corpus(path, demo).tokens > 100_000
    else:
        config, _ = load_head(path, demo)
        assert config.kind == kind
    recipe = json.loads((SHIPPED / kind / "recipe.json").read_text())
    assert recipe["prompts"]["source"] == "magpie"
    assert sum(f.stat().st_size for f in SHIPPED.rglob("*") if f.is_file()) <= 25 * 2**20


def test_shipped_heads_refuse_another_model(target):
    for kind in KINDS:
        assert find_head(target, kind) is None


@pytest.mark.parametrize("kind", KINDS)
def test_shipped_head_drafts_exactly(demo, kind):
    plain = Engine(demo)
    spec = Engine(demo, edgespec.make_drafter(SpecConfig(method=kind), demo, SamplingConfig()))
    accepted = 0
    for prompt in PROMPTS:
        msgs = [{"role": "user", "content": prompt}]
        a = plain.generate(msgs, max_tokens=40)
        b = spec.generate(msgs, max_tokens=40)
        assert b.token_ids == a.token_ids, prompt
        accepted += b.stats.accepted
    assert accepted > 0  # a trained head's drafts are taken, not only proposed


@pytest.mark.skipif(not (default_eval_dir() / "mt_bench.jsonl").is_file(),
                    reason="the evaluation prompts (../shared/eval) are not here")
def test_shipped_eagle3_never_trained_on_evaluation_prompts():
    """Every question the shipped EAGLE-3 head's answers were written for (kept in data/) passes
    the evaluation exclusion, and they are all the questions its recipe counts."""
    recipe = json.loads((SHIPPED / "eagle3" / "recipe.json").read_text())
    files = sorted((ROOT / "data" / "SmolLM2-135M-Instruct").glob("eagle3-questions-run*.jsonl.gz"))
    questions = [json.loads(line)["prompt"] for f in files for line in gzip.open(f, "rt")]
    assert len(questions) == recipe["prompts"]["kept"] == sum(r["questions"]["kept"]
                                                              for r in recipe["runs"])
    exclusion = EvalExclusion.from_dir()
    assert len(exclusion) >= 80
    assert not [q for q in questions if exclusion.overlaps(q)]
    # the held-out questions that design choices are measured on are some of these (written by
    # the model, so excluded above), not evaluation prompts
    held = [json.loads(line)["turns"][0] for line in
            (ROOT / "data" / "SmolLM2-135M-Instruct" / "heldout-questions.jsonl").open()]
    assert len(held) == 64 and set(held) <= set(questions)
