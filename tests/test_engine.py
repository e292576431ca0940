"""The engine on tiny random models: exactness against naive decoding, oracles, adversaries.

The naive reference recomputes the whole sequence without any cache state carried over, so it
checks the KV cache, tree positions, masks and commit gathers of the fast path.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec import Engine, SamplingConfig
from edgespec.drafters.base import Drafter
from edgespec.drafters.draft_model import DraftModelDrafter
from edgespec.tree import DraftTree

from .tiny import KINDS

PROMPT = "the cat sat on the mat and then"
TARGET_KINDS = tuple(KINDS)  # conftest's `target`: every test once per model kind


def naive_greedy(target, ids: list[int], n: int) -> list[int]:
    """Greedy decoding by recomputing the full sequence from scratch each step."""
    seq, out = list(ids), []
    for _ in range(n):
        logits = target.score(seq, target.make_cache()).logits[-1]
        t = int(mx.argmax(logits).item())
        out.append(t)
        seq.append(t)
    return out


class ScriptedDrafter(Drafter):
    """Proposes trees built by ``make(root, history, budget)``; for adversarial tests."""

    name = "scripted"

    def __init__(self, make):
        self.make = make

    def reset(self):
        self.history = []

    def prefill(self, tokens, target_out, sampling=None):
        self.history = list(tokens)

    def propose(self, budget):
        return self.make(self.history[-1], self.history, budget)

    def update(self, accepted, tree, target_out):
        self.history.extend(accepted.tokens)


def test_plain_decoding_matches_naive(target):
    eng = Engine(target)
    ids = eng.encode(PROMPT)
    res = eng.generate(PROMPT, max_tokens=24)
    assert res.token_ids == naive_greedy(target, ids, 24)
    assert res.stats.tau == 1.0 and res.stats.target_forwards == 24


@pytest.mark.parametrize("k", [1, 3, 6])
def test_self_draft_oracle(target, k):
    """The target drafting for itself accepts every token: tau = k + 1, output unchanged."""
    plain = Engine(target).generate(PROMPT, max_tokens=40)
    drafter = DraftModelDrafter(target, SamplingConfig(), num_draft=k, max_draft=k, adaptive=False)
    res = Engine(target, drafter).generate(PROMPT, max_tokens=40)
    assert res.token_ids == plain.token_ids
    assert res.stats.acceptance_rate == 1.0
    full_steps = 40 // (k + 1)
    assert res.stats.target_forwards == full_steps + (1 if 40 % (k + 1) else 0)


def _random_tree(rng, vocab, root, budget, n_max=9):
    n = int(rng.integers(0, min(n_max, budget) + 1))
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n + 1)]
    tokens = [root] + [int(rng.integers(0, vocab)) for _ in range(n)]
    return DraftTree(tokens, parents)


def test_a_step_scores_no_more_rows_than_the_target_scores_exactly(target, monkeypatch):
    """Where the native kernels run, a forward of more than ``SMALL_M_MAX`` tokens leaves the
    native block for the module path, whose bits differ from one-token decoding's: the engine
    keeps every verify within ``Target.exact_rows``, whatever budget a drafter would fill."""
    from edgespec.kernels.backend import SMALL_M_MAX, native_enabled

    if not native_enabled():
        pytest.skip("no native kernels: no row limit applies")
    assert target.exact_rows() == SMALL_M_MAX
    plain = Engine(target).generate(PROMPT, max_tokens=60)
    budgets, rows = [], []
    real = target.score
    monkeypatch.setattr(target, "score", lambda tokens, cache, **kw: rows.append(
        len(tokens.tokens) if isinstance(tokens, DraftTree) else len(tokens))
        or real(tokens, cache, **kw))

    def greedy_chain(root, history, budget):  # the target's own next tokens, as many as allowed
        budgets.append(budget)
        return DraftTree.chain(root, plain.token_ids[len(history) - len(prompt_ids):][:budget])

    prompt_ids = Engine(target).encode(PROMPT)
    res = Engine(target, ScriptedDrafter(greedy_chain)).generate(PROMPT, max_tokens=60)
    assert res.token_ids == plain.token_ids
    assert max(budgets) == SMALL_M_MAX - 1 and max(rows[1:]) == SMALL_M_MAX


def test_random_trees_keep_greedy_output(target):
    rng = np.random.default_rng(0)
    vocab = target.args.vocab_size
    plain = Engine(target).generate(PROMPT, max_tokens=30)
    drafter = ScriptedDrafter(lambda root, hist, budget: _random_tree(rng, vocab, root, budget))
    res = Engine(target, drafter).generate(PROMPT, max_tokens=30)
    assert res.token_ids == plain.token_ids


def decoy_tree(root: int, want: list[int], vocab: int, rng, min_decoys: int) -> DraftTree:
    """The chain ``want`` below ``root``, each true child after ``min_decoys``..2 random decoy
    siblings: the accepted path is the last child at every depth."""
    tokens, parents, u = [root], [-1], 0
    for t in want:
        for _ in range(int(rng.integers(min_decoys, 3))):
            tokens.append(int((t + rng.integers(1, vocab)) % vocab))
            parents.append(u)
        tokens.append(t)
        parents.append(u)
        u = len(tokens) - 1
    return DraftTree(tokens, parents)


def test_oracle_trees_with_decoys_accept_the_true_branch(target):
    """Trees whose true continuation hides in a random branch among decoys: the verifier must
    find it (many tokens per forward), and gathering that branch into the cache must keep the
    rest of the output exact."""
    eng = Engine(target)
    ids = eng.encode(PROMPT)
    truth = eng.generate(PROMPT, max_tokens=48).token_ids
    rng = np.random.default_rng(1)
    vocab = target.args.vocab_size

    def make(root, hist, budget):
        done = len(hist) - len(ids)
        return decoy_tree(root, truth[done : done + min(4, budget)], vocab, rng, min_decoys=0)

    res = Engine(target, ScriptedDrafter(make)).generate(PROMPT, max_tokens=48)
    assert res.token_ids == truth
    assert res.stats.tau > 4.0


def test_long_generation_with_window_rollover(tiny_models):
    """A sliding-window model past the point where the cache drops old entries."""
    target = tiny_models.load(window=8)
    drafter = DraftModelDrafter(target, SamplingConfig(), num_draft=3, adaptive=False)
    eng = Engine(target, drafter)
    ids = eng.encode(PROMPT)
    res = eng.generate(PROMPT, max_tokens=400)
    assert len(res.token_ids) == 400
    assert res.token_ids[-20:] == naive_greedy(target, ids + res.token_ids[:-20], 20)


def test_seeded_sampling_is_reproducible(target):
    s = SamplingConfig(temperature=0.8, seed=5)
    d1 = DraftModelDrafter(target, s, num_draft=2)
    d2 = DraftModelDrafter(target, s, num_draft=2)
    a = Engine(target, d1, s).generate(PROMPT, max_tokens=20).token_ids
    b = Engine(target, d2, s).generate(PROMPT, max_tokens=20).token_ids
    assert a == b


def test_prefix_reuse_keeps_output_and_skips_prefill(target):
    """A second turn that resends the history reuses the KV of the shared prefix."""
    fresh = Engine(target, reuse_prefix=False)
    eng = Engine(target)
    turn1 = [{"role": "user", "content": "the cat sat"}]
    first = eng.generate(turn1, max_tokens=12)
    turn2 = turn1 + [{"role": "assistant", "content": first.text},
                     {"role": "user", "content": "and then"}]
    second = eng.generate(turn2, max_tokens=12)
    assert second.stats.cached_tokens > 5
    assert second.token_ids == fresh.generate(turn2, max_tokens=12).token_ids
    # an unrelated prompt starts from scratch and is still exact
    third = eng.generate("zebra crossing", max_tokens=12)
    assert third.token_ids == fresh.generate("zebra crossing", max_tokens=12).token_ids


def test_interrupted_stream_leaves_engine_usable(target):
    eng = Engine(target)
    stream = eng.stream(PROMPT, max_tokens=30)
    next(stream)
    stream.close()  # e.g. a client that disconnected
    again = eng.generate(PROMPT, max_tokens=10).token_ids
    assert again == Engine(target, reuse_prefix=False).generate(PROMPT, max_tokens=10).token_ids


def test_multi_turn_with_draft_model_reuses_both_caches(target):
    drafter = DraftModelDrafter(target, SamplingConfig(), num_draft=3)
    eng = Engine(target, drafter)
    fresh = Engine(target, reuse_prefix=False)
    turn = [{"role": "user", "content": "the cat sat"}]
    for follow_up in ("and then", "why"):
        out = eng.generate(turn, max_tokens=10)
        assert out.token_ids == fresh.generate(turn, max_tokens=10).token_ids
        turn = turn + [{"role": "assistant", "content": out.text}, {"role": "user", "content": follow_up}]
    assert eng.last_stats.cached_tokens > 0 and drafter.cache.offset > 0


@pytest.mark.parametrize("max_tokens", [1, 2, 17])
def test_pipelined_plain_decoding_is_the_step_loop(target, max_tokens):
    """Plain greedy decoding runs pipelined (the next forward in flight while a token is read);
    it gives the step loop's tokens and leaves the cache as the step loop does (it holds the KV
    of every token but the last), so the next request reuses the shared prefix."""
    fast, loop = Engine(target), Engine(target, pipeline=False)
    for prompt in (PROMPT, "zebra crossing at night", PROMPT + " again"):
        a = fast.generate(prompt, max_tokens=max_tokens)
        b = loop.generate(prompt, max_tokens=max_tokens)
        assert a.token_ids == b.token_ids
        assert a.stats.generated_tokens == b.stats.generated_tokens
        assert a.stats.target_forwards == b.stats.target_forwards
        assert fast.prefixes.entries == loop.prefixes.entries >= 1  # each kept its cache
    assert a.token_ids == naive_greedy(target, fast.encode(PROMPT + " again"), max_tokens)


def test_pipelined_decoding_rolls_back_the_step_past_a_stop_or_a_closed_stream(target):
    eng = Engine(target)
    first = Engine(target, pipeline=False).generate(PROMPT, max_tokens=6)
    stop_text = eng.target.tokenizer.decode(first.token_ids[2:4])
    assert stop_text
    stopped = eng.generate(PROMPT, max_tokens=30, stop=[stop_text])
    assert stopped.finish_reason == "stop" and len(stopped.token_ids) < 4
    assert eng.prefixes.entries >= 1  # the cache was consistent: the store kept it
    stream = eng.stream(PROMPT, max_tokens=30)
    next(stream)
    next(stream)
    stream.close()  # a step was in flight
    assert eng.prefixes.entries >= 1  # the cache was consistent: the store kept it
    again = eng.generate(PROMPT + " the", max_tokens=8)
    assert again.stats.cached_tokens > 0
    assert again.token_ids == Engine(target, reuse_prefix=False).generate(
        PROMPT + " the", max_tokens=8).token_ids
