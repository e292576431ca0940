"""A head's draft vocabulary: the target tokens it can propose (EAGLE-3's LM head rows; the rows
of the target's LM head that Medusa heads sharing it read).

Contract: ``draft_vocabulary(store, train_seqs, held_seqs, size, vocab_size)`` returns the
``min(size, vocab_size)`` most frequent labels (the target's argmax at trained positions) of the
TRAINING sequences, ties broken by the smaller id, sorted by id (so ``d2t`` offsets are >= 0),
and the fraction of held-out labels they cover: the best top-1 a head with this vocabulary can
reach there.
"""

from __future__ import annotations

import numpy as np

from .features import FeatureStore


def label_counts(store: FeatureStore, seqs: list[int], vocab_size: int) -> np.ndarray:
    counts = np.zeros(vocab_size, dtype=np.int64)
    for s in seqs:
        r = store.rows(s)
        labels = np.asarray(store.labels[r])[np.asarray(store.mask[r]) > 0]
        counts += np.bincount(labels, minlength=vocab_size)
    return counts


def draft_vocabulary(store: FeatureStore, train_seqs: list[int], held_seqs: list[int],
                     size: int, vocab_size: int) -> tuple[np.ndarray, float]:
    counts = label_counts(store, train_seqs, vocab_size)
    order = np.lexsort((np.arange(vocab_size), -counts))  # most frequent first, then by id
    ids = np.sort(order[: min(size, vocab_size)])
    return ids, vocab_coverage(store, held_seqs, ids, vocab_size)


def vocab_coverage(store: FeatureStore, held_seqs: list[int], ids, vocab_size: int) -> float:
    """The share of the held-out labels that the draft vocabulary ``ids`` has."""
    held = label_counts(store, held_seqs, vocab_size)
    return round(float(held[ids].sum() / held.sum()), 4) if held.sum() else 1.0
