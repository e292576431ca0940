"""Training prompts: every --data layout, its errors, and the evaluation-prompt exclusion (all of
MT-bench's turns refused; paraphrases sharing an 8-word run and case/punctuation variants too; an
unrelated prompt kept)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgespec.training.exclusion import EvalExclusion, default_eval_dir
from edgespec.training.prompts import TrainingDataError, read_prompts

MT_BENCH = default_eval_dir() / "mt_bench.jsonl"
needs_eval = pytest.mark.skipif(not MT_BENCH.is_file(), reason=f"{MT_BENCH} is not here")
HAWAII = ("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting "
          "cultural experiences and must-see attractions.")


def write(tmp_path: Path, *records, raw: str | None = None) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text(raw if raw is not None else "".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def exclusion() -> EvalExclusion:
    return EvalExclusion.from_dir()


@pytest.fixture
def none() -> EvalExclusion:
    return EvalExclusion()


def test_every_layout(tmp_path, none):
    path = write(tmp_path,
                 {"prompt": "Tell me about ships."},
                 {"messages": [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "What is a prime?"},
                               {"role": "assistant", "content": "A number."},
                               {"role": "user", "content": "Three examples?"},
                               {"role": "assistant", "content": "2, 3, 5."}]},
                 {"conversations": [{"from": "human", "value": "How do bees make honey?"},
                                    {"from": "gpt", "value": "From nectar."}]},
                 {"turns": ["Describe a quiet morning.", "Now as a poem."]},
                 {"instruction": "Sort these numbers."})
    records, report = read_prompts(path, none)
    assert [r["prompt"] for r in records] == ["Tell me about ships.", "Three examples?",
                                             "How do bees make honey?", "Describe a quiet morning.",
                                             "Sort these numbers."]
    assert [r["id"] for r in records] == [0, 1, 2, 3, 4]
    # the conversation is cut after its last user turn; earlier turns stay as context
    assert records[1]["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a prime?"},
        {"role": "assistant", "content": "A number."}, {"role": "user", "content": "Three examples?"}]
    assert "messages" not in records[2]  # one user turn: the prompt alone
    assert report == {"read": 5, "kept": 5, "dropped_eval": 0, "duplicates": 0}


def test_duplicates_and_blank_lines_are_not_prompts(tmp_path, none):
    path = write(tmp_path, raw='{"prompt": "Hi there."}\n\n{"prompt": "Hi there."}\n{"prompt": "Bye."}\n')
    records, report = read_prompts(path, none)
    assert [r["prompt"] for r in records] == ["Hi there.", "Bye."]
    assert report["duplicates"] == 1 and report["read"] == 3


@pytest.mark.parametrize("line, needle", [
    ("not json", "line 2: not JSON"),
    ("[1, 2]", "line 2: a JSON list, expected an object"),
    ('{"text": "hello"}', "line 2: no prompt field (keys: text)"),
    ('{"prompt": 5}', "line 2: the prompt must be a string"),
    ('{"messages": []}', "line 2: 'messages' must be a non-empty list"),
    ('{"messages": [{"role": "narrator", "content": "x"}]}', "line 2: each of 'messages' must be"),
    ('{"messages": [{"role": "assistant", "content": "x"}]}', "line 2: the conversation has no user turn"),
    ('{"conversations": [{"from": "human"}]}', "from/value"),
    ('{"turns": "one"}', "line 2: 'turns' must be a non-empty list of strings"),
    ('{"prompt": "   "}', "line 2: the last user turn is empty"),
])
def test_bad_lines_name_the_line_and_the_layouts(tmp_path, none, line, needle):
    path = write(tmp_path, raw='{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(TrainingDataError) as e:
        read_prompts(path, none)
    assert needle in str(e.value)
    assert str(path) in str(e.value)
    if "line 2" in needle:
        assert '{"prompt": str}' in str(e.value) and "conversations" in str(e.value)


def test_missing_file_and_nothing_left(tmp_path, exclusion):
    with pytest.raises(TrainingDataError, match="no such file"):
        read_prompts(tmp_path / "nope.jsonl", exclusion)
    if MT_BENCH.is_file():
        with pytest.raises(TrainingDataError, match="no prompt left to train on .1 read, 1 overlap"):
            read_prompts(write(tmp_path, {"prompt": HAWAII}), exclusion)


@needs_eval
def test_every_mt_bench_turn_is_excluded(tmp_path, exclusion):
    turns = [t for line in MT_BENCH.read_text().splitlines() if line.strip()
             for t in json.loads(line)["turns"]]
    assert len(turns) == 160
    assert all(exclusion.overlaps(t) for t in turns)
    # and through read_prompts: each turn as a prompt record, plus one unrelated prompt
    path = write(tmp_path, *[{"prompt": t} for t in turns], {"prompt": "How do I bake sourdough bread?"})
    records, report = read_prompts(path, exclusion)
    assert [r["prompt"] for r in records] == ["How do I bake sourdough bread?"]
    assert report["dropped_eval"] == 160


@needs_eval
@pytest.mark.parametrize("text", [
    "Please write me something: an engaging travel blog post about a recent trip, to Iceland.",
    "compose AN engaging travel blog-post about a recent trip to hawaii highlighting cultural "
    "experiences and must see attractions!!",
    "prove the pythagorean theorem",  # short (< 8 words): only the exact match can catch it
    "Ich   verstehe nur BAHNHOF?",
])
def test_paraphrases_and_variants_are_excluded(exclusion, text):
    assert exclusion.overlaps(text)


@needs_eval
@pytest.mark.parametrize("text", [
    "How do I bake sourdough bread at home?",
    "Write about an engaging travel blog post about a day.",  # a 7-word run only
    "Prove the Pythagorean theorem for right triangles using areas of squares.",  # not equal
])
def test_unrelated_prompts_are_kept(exclusion, text):
    assert not exclusion.overlaps(text)


@needs_eval
def test_a_conversation_is_excluded_by_any_of_its_turns(tmp_path, exclusion):
    path = write(tmp_path,
                 {"messages": [{"role": "user", "content": HAWAII},
                               {"role": "assistant", "content": "Aloha!"},
                               {"role": "user", "content": "Make it shorter."}]},
                 {"prompt": "Name three rivers in Africa."})
    records, report = read_prompts(path, exclusion)
    assert [r["prompt"] for r in records] == ["Name three rivers in Africa."]
    assert report["dropped_eval"] == 1
