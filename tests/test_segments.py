"""``Step.segments``: which text came from accepted drafts and which from the target.

The reference is the naive attribution the chat app used to compute on its own: decode every
committed token a second time, one by one, and tag each token's text with ``i < step.accepted``
(the text a final flush completes is the target's). The engine's segments must give every
character the same tag, and their concatenation must be the step's text exactly -- under greedy
and sampled decoding, with rejected drafts, stop strings cutting mid-step or holding text back,
and UTF-8 characters split over byte tokens.
"""

from __future__ import annotations

import pytest

from edgespec import Engine, SamplingConfig
from edgespec.drafters.draft_model import DraftModelDrafter
from edgespec.loading.tokenizer import StreamDecoder
from edgespec.stream_text import Segment, TextStream
from edgespec.targets import load_target

from .tiny import make_tiny_model

PROMPT = "the cat sat on the mat and then"
GREEDY, SAMPLED = SamplingConfig(), SamplingConfig(temperature=1.0, seed=7)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("segments")
    target = load_target(make_tiny_model(root / "t", seed=3, scale=2.0), dtype="float32")
    # the target's first layer alone: agrees often, not always, so drafts are accepted and rejected
    other = load_target(make_tiny_model(root / "d", seed=3, scale=2.0, layers=1), dtype="float32")
    target.tokenizer.eos_token_ids = other.tokenizer.eos_token_ids = frozenset()
    return target, other


def reference_tags(tokenizer, steps) -> list[bool]:
    """One drafted/target tag per character of the whole output, decoding every token again."""
    decoder, tags = StreamDecoder(tokenizer), []
    for step in steps:
        for i, t in enumerate(step.token_ids):
            tags += [i < step.accepted] * len(decoder.add(t))
    return tags + [False] * len(decoder.flush())


def check_segments(tokenizer, steps) -> str:
    tags = []
    for step in steps:
        assert all(s.text for s in step.segments), "no empty runs"
        assert all(a.drafted != b.drafted for a, b in zip(step.segments, step.segments[1:]))
        assert "".join(s.text for s in step.segments) == step.text
        tags += [s.drafted for s in step.segments for _ in s.text]
    ref = reference_tags(tokenizer, steps)
    assert tags == ref[: len(tags)]  # the reference goes on past a stop string
    return "".join(s.text for s in steps)


def run(target, drafter_model, sampling, **kwargs):
    drafter = DraftModelDrafter(drafter_model, sampling, num_draft=4, adaptive=False)
    return Engine(target, drafter, sampling).generate(PROMPT, **kwargs)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("drafter", ["self", "other"])
def test_segments_match_the_naive_attribution(models, sampling, drafter):
    target, other = models
    res = run(target, target if drafter == "self" else other, sampling, max_tokens=60)
    text = check_segments(target.tokenizer, res.steps)
    assert text == res.text == target.tokenizer.decode(res.token_ids)
    kinds = {s.drafted for step in res.steps for s in step.segments}
    assert kinds == {True, False}
    # the split the tags come from: the first ``accepted`` tokens of a step were drafted
    assert sum(s.accepted for s in res.steps) == res.stats.accepted
    assert (res.stats.acceptance_rate == 1.0) == (drafter == "self")  # "other": some rejected


def test_greedy_segments_keep_output_exact(models):
    target, _ = models
    plain = Engine(target).generate(PROMPT, max_tokens=40)
    res = run(target, target, GREEDY, max_tokens=40)
    assert res.token_ids == plain.token_ids and res.text == plain.text
    assert all(not s.drafted for step in plain.steps for s in step.segments)


def first_unique_inside_a_step(res, n: int = 3) -> tuple[str, int]:
    """``n`` characters that start inside a drafted step (not at its start) and occur nowhere
    earlier in the output, and where they start."""
    start = 0
    for step in res.steps:
        for k in range(1, len(step.text) - n + 1):
            if step.accepted >= 3 and res.text.find(step.text[k : k + n]) == start + k:
                return step.text[k : k + n], start + k
        start += len(step.text)
    raise AssertionError("no usable stop string in the output")


def test_stop_string_cutting_mid_step(models):
    target, _ = models
    full = run(target, target, GREEDY, max_tokens=60)
    stop, at = first_unique_inside_a_step(full)
    cut = run(target, target, GREEDY, max_tokens=60, stop=[stop])
    assert cut.finish_reason == "stop" and cut.text == full.text[:at] and at > 0
    assert len(cut.token_ids) < len(full.token_ids)
    check_segments(target.tokenizer, cut.steps)


def test_held_back_text_keeps_its_attribution(models):
    """A stop string that never completes: its prefix is held back, then released in a later
    step, still tagged by the token that produced it."""
    target, other = models
    full = run(target, other, SAMPLED, max_tokens=60)
    last = next(s.text[-1] for s in full.steps[2:-1] if s.text)  # a step ends with this character
    never = last + "\ue000\uffff"
    held = run(target, other, SAMPLED, max_tokens=60, stop=[never])
    assert held.token_ids == full.token_ids and held.text == full.text
    check_segments(target.tokenizer, held.steps)
    assert [s.text for s in held.steps] != [s.text for s in full.steps]  # something was held back


# TextStream alone: UTF-8 across tokens, flush, stop strings ----------------------------------

def test_utf8_split_over_tokens_belongs_to_the_completing_token(models):
    tok = models[0].tokenizer
    a, b = tok.encode("é")  # two byte tokens: 0xC3 0xA9
    stream = TextStream(tok)
    stream.add(a, drafted=True)
    assert stream.take() == ()  # incomplete: nothing to show yet
    stream.add(b, drafted=False)
    assert stream.take() == (Segment("é", False),)
    stream.add(a, drafted=False)
    stream.add(b, drafted=True)
    stream.add(tok.encode("x")[0], drafted=False)
    assert stream.take() == (Segment("é", True), Segment("x", False))
    stream.add(a, drafted=True)
    assert stream.flush() == (Segment("\ufffd", False),)  # completed by no token: the target's


def test_take_and_flush_split_runs_at_the_held_back_text(models):
    tok = models[0].tokenizer
    stream = TextStream(tok, stop=("cat!",))
    for i, t in enumerate(tok.encode("a ca")):
        stream.add(t, drafted=i < 2)
    assert stream.take() == (Segment("a ", True),)  # "ca" could begin "cat!"
    assert not stream.add(tok.encode("b")[0], drafted=True)
    assert stream.take() == (Segment("ca", False), Segment("b", True))
    for t in tok.encode(" cat! more"):
        if stream.add(t, drafted=False):
            break
    assert stream.flush() == (Segment(" ", False),) and stream.text.endswith("b ")
