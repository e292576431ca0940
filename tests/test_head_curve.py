"""The n-gram baselines of scripts/head_curve.py score what a table of the training rows predicts,
on the rows a head is scored on (row p: the label at p+1, from x_p and x_{p+1})."""

from __future__ import annotations

import numpy as np

from .script_module import load_script


def _curve():
    return load_script("head_curve")


class _Store:
    """The store fields the baselines read: sequences back to back, labels[t] = the model's
    argmax at t (its next token), mask[t] = 1 where that label trains."""

    def __init__(self, seqs: list[tuple[list[int], int]]):
        self.ids = np.concatenate([np.array(ids) for ids, _ in seqs])
        labels, masks = [], []
        for ids, p in seqs:  # greedy answers: the label at t is the token at t+1
            labels.append(np.array(ids[1:] + [0]))
            masks.append(np.array([0] * (p - 1) + [1] * (len(ids) - p + 1)))
        self.labels, self.mask = np.concatenate(labels), np.concatenate(masks)
        self.offsets = np.concatenate([[0], np.cumsum([len(ids) for ids, _ in seqs])])

    def rows(self, s: int) -> slice:
        return slice(int(self.offsets[s]), int(self.offsets[s + 1]))


def test_trigram_resolves_what_the_bigram_cannot():
    # after 5 comes 6 (when 4 preceded it) or 7 (when 3 did); 7 is the commoner in training
    train = [([1, 4, 5, 6, 9], 2), ([1, 3, 5, 7, 9], 2), ([2, 3, 5, 7, 9], 2)]
    held = [([1, 4, 5, 6, 9], 2)]
    store = _Store(train + held)
    got = _curve().ngram_agreement(store, [0, 1, 2], [3])
    # row p predicts the label at p+1 (x_{p+2}); the held rows that train are p = 0..3:
    # (1,4)->5, (4,5)->6, (5,6)->9, (6,9)->0 (the label after the last token)
    assert got["rows"] == 4
    assert got["trigram"] == 1.0  # every context was seen in training with that label
    # the bigram misses after 5 (7 is commoner there) and gets the other three
    assert got["bigram"] == 0.75


def test_unseen_contexts_fall_back_to_the_commonest_label():
    store = _Store([([1, 2, 3, 3, 3, 3], 2), ([8, 9, 7], 2)])
    got = _curve().ngram_agreement(store, [0], [1])
    # held rows: (8,9)->7, (9,7)->0; neither context nor 9/7 alone was seen: guess 3 both times
    assert got == {"rows": 2, "trigram": 0.0, "bigram": 0.0}
