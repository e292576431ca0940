"""The engine with the Metal kernels' code path selected in emulation
(``EDGESPEC_METAL_KERNELS=emulate``): tree attention inside the target's attention, acceptance
and KV compaction all run the kernels' source, and greedy output stays token-identical to plain
decoding (kernels on and off) for a tree drafter (random and decoy trees), EAGLE-3 with a random
head and every method of the public factory (draft, lookup, lookahead, early-exit, quantized,
cascade, auto), on a plain and a sliding-window model. Seeded sampling commits the same tokens
with the kernels as with the numpy rule (both consume the same uniforms).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from edgespec import Engine, SamplingConfig, SpecConfig, make_drafter
from edgespec.drafters.eagle3 import Eagle3Drafter
from edgespec.kernels import metal_emulation
from edgespec.kernels.backend import metal_kernels, set_metal_kernels

from .test_eagle3 import random_head
from .test_engine import ScriptedDrafter, _random_tree, decoy_tree

EMULATED, WHY = metal_emulation.available()
pytestmark = pytest.mark.skipif(not EMULATED, reason=f"Metal kernels not emulated here: {WHY}")
TARGET_KINDS = ("llama", "window")
PROMPT = "the cat sat on the mat and then"
TOKENS = 16


@pytest.fixture
def emulate(monkeypatch):
    """Kernels emulated for the test; counts the launches of each kernel."""
    launches = Counter()
    run = metal_emulation.run

    def counted(kernel, *a, **kw):
        launches[kernel.name] += 1
        return run(kernel, *a, **kw)

    monkeypatch.setattr(metal_emulation, "run", counted)
    set_metal_kernels("emulate")
    yield launches
    set_metal_kernels(None)


def decoys(truth: list[int], prompt_len: int, vocab: int, rng) -> ScriptedDrafter:
    """Trees hiding the true continuation among decoy siblings: accepted paths that are not a
    prefix of the tree's nodes, so the cache compacts them."""

    def make(root, hist, budget):
        done = len(hist) - prompt_len
        return decoy_tree(root, truth[done : done + min(4, budget)], vocab, rng, min_decoys=1)

    return ScriptedDrafter(make)


def drafters(target, truth: list[int]):
    rng = np.random.default_rng(0)
    vocab = target.args.vocab_size
    greedy = SamplingConfig()
    prompt_len = len(Engine(target).encode(PROMPT))
    return {
        "random-trees": ScriptedDrafter(lambda root, h, budget: _random_tree(rng, vocab, root, budget)),
        "decoys": decoys(truth, prompt_len, vocab, rng),
        "draft": make_drafter(SpecConfig(method="draft", num_draft=3, draft="-"), target, greedy,
                              draft=target),
        "lookup": make_drafter(SpecConfig(method="lookup", num_draft=4), target, greedy),
        "eagle3": Eagle3Drafter(target, random_head(target), None, nodes=6),
    }


def test_greedy_output_is_unchanged_with_emulated_kernels(target, emulate):
    set_metal_kernels("off")
    plain_off = Engine(target).generate(PROMPT, max_tokens=TOKENS).token_ids
    set_metal_kernels("emulate")
    assert metal_kernels() == "emulate"
    plain = Engine(target).generate(PROMPT, max_tokens=TOKENS).token_ids
    assert plain == plain_off
    for name, drafter in drafters(target, plain).items():
        res = Engine(target, drafter).generate(PROMPT, max_tokens=TOKENS)
        assert res.token_ids == plain, name
        if name == "decoys":
            assert res.stats.tau > 3
    # every op ran in its kernel: attention per layer and forward, acceptance, compaction
    assert emulate["tree_attention"] > 0 and emulate["accept_greedy"] > 0
    assert emulate["compact_kv"] > 0 and emulate["accept_sampling"] == 0


FACTORY = {"draft": {"draft": "-"}, "lookup": {}, "lookahead": {}, "early-exit": {"exit_layer": 1},
           "quantized": {"draft_bits": 4}, "cascade": {"draft": "-"}, "auto": {"draft": "-"}}


def test_every_public_method_keeps_greedy_output(target, tiny_models, emulate):
    """The factory's methods (a draft model that partly agrees with the target where one is
    needed), kernels emulated, against plain decoding with the kernels off."""
    draft = tiny_models.load(window=target.model.cache_windows()[0], scale=1.3)
    set_metal_kernels("off")
    plain = Engine(target).generate(PROMPT, max_tokens=TOKENS).token_ids
    set_metal_kernels("emulate")
    for method, kw in FACTORY.items():
        drafter = make_drafter(SpecConfig(method=method, num_draft=3, **kw), target,
                               SamplingConfig(), draft=draft)
        assert Engine(target, drafter).generate(PROMPT, max_tokens=TOKENS).token_ids == plain, method
    assert emulate["tree_attention"] > 0


def test_seeded_sampling_commits_the_same_tokens_with_the_kernels(target, emulate):
    """The rejection rule's walk (the kernels'), which a seeded request takes with
    ``keyed_seeds=False``; the keyed rule draws on the host either way."""
    s = SamplingConfig(temperature=0.8, seed=3)
    outs = []
    for mode in ("off", "emulate"):
        set_metal_kernels(mode)
        drafter = make_drafter(SpecConfig(method="draft", num_draft=3, draft="-"), target, s,
                               draft=target)
        outs.append(Engine(target, drafter, s, keyed_seeds=False).generate(
            PROMPT, max_tokens=TOKENS).token_ids)
    assert outs[0] == outs[1]
    assert emulate["accept_sampling"] > 0
