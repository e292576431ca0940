"""Prompt lookup: the n-gram index, tree proposals, and exactness on tiny models."""

from __future__ import annotations

import numpy as np

from edgespec import Engine
from edgespec.drafters.lookup import NgramIndex, PromptLookupDrafter


def test_index_finds_longest_most_recent_distinct_continuations():
    idx = NgramIndex(1, 3)
    idx.extend([5, 6, 7, 1, 5, 6, 8, 2, 5, 6])
    n, starts = idx.continuations(max_branches=3)
    assert n == 2  # "5 6" occurred before, "2 5 6" did not
    assert [idx.tokens[s] for s in starts] == [8, 7]  # most recent first
    idx.extend([9])
    assert idx.continuations(3) == (0, [])
    idx.extend([6])
    assert idx.continuations(1) == (1, [10])  # the most recent '6' was followed by 9 (at 10)
    assert idx.continuations(3) == (1, [10, 6, 2])  # then 8 and 7



def test_index_is_incremental_and_matches_a_rescan():
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 6, 300).tolist()
    idx = NgramIndex(1, 4)
    for a in range(0, 300, 37):
        idx.extend(toks[a : a + 37])
    for n in range(1, 5):
        key = tuple(toks[-n:])
        expect = [i + n for i in range(len(toks) - n) if tuple(toks[i : i + n]) == key]
        assert idx.follow.get(key, []) == expect


def test_proposes_a_tree_of_alternatives():
    d = PromptLookupDrafter(num_draft=4, max_branches=3)
    d.prefill([1, 2, 3, 4, 9, 1, 2, 7, 7, 9, 1, 2], None)
    tree = d.propose(budget=10)
    firsts = sorted(tree.tokens[c] for c in tree.children(0))
    assert firsts == [3, 7]
    assert tree.tokens[0] == 2
    assert d.propose(budget=0).num_drafted == 0


REPETITIVE = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"


def test_lookup_greedy_is_exact_and_drafts_get_accepted(target):
    plain = Engine(target).generate(REPETITIVE, max_tokens=60)
    res = Engine(target, PromptLookupDrafter()).generate(REPETITIVE, max_tokens=60)
    assert res.token_ids == plain.token_ids
    assert res.stats.proposed > 0
    # a random model soon repeats itself, and lookup must then copy from its own output
    assert res.stats.accepted > 0


