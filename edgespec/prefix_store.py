"""PrefixStore: the KV caches of finished requests, kept under a memory budget, from which a new
request takes the longest prefix of its prompt that any of them holds.

Contract. ``put(seq, cache)`` gives the store a cache holding the KV of ``seq[:-1]`` (what the
engine's cache holds at the end of a decoding: every token but the last, which was never
scored); the store owns it from then on. ``take(ids, make_cache)`` returns a cache the caller
owns exclusively, holding the KV of the longest prefix of ``ids[:-1]`` that a stored cache can
return to, and that prefix's length (the last prompt token is always scored: its logits start
the generation); ``(make_cache(), 0)`` when no stored cache shares a usable prefix. Scoring the
rest of the prompt from it gives the bits scoring it after ``trim`` on that cache would give.

Decisions:

- **Lookup** is a scan over the entries with numpy (the first token where two id arrays differ);
  an entry can serve any common prefix, not only a prompt it extends. The best entry is the one
  whose usable prefix is longest: the common prefix brought down to an offset the cache can
  return to (``reachable``: a hybrid model's recurrent states are kept at pinned offsets only;
  ``floor``: a sliding layer that dropped entries cannot go back before its window).
- **Handing out.** When the usable prefix is the entry's whole length, the entry itself leaves
  the store (no copy); otherwise the caller gets ``cache.fork(n)`` (its first write copies the
  ``n`` rows into buffers of its own) and the entry stays. Ties go to the whole entry, then to
  the most recently used.
- **Duplicates.** ``put`` drops the entries whose tokens are a prefix of the new one's when the
  new one serves every lookup they would (``_covers``), and keeps nothing when a stored entry
  already extends the new one and serves all its lookups.
- **Budget.** ``nbytes`` is the sum of the stored caches' key/value buffers (``KVCache.nbytes``;
  a recurrent state's arrays are not counted). After each ``put`` the least recently used
  entries (``take`` and ``put`` both count as use) are dropped until it fits; a cache larger
  than the whole budget is not kept. A cache whose offset is not ``len(seq) - 1`` (a forward that
  could not be rolled back) is not kept either.
- **Threads.** Not thread-safe: one thread (the generation worker) calls it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .cache import KVCache
from .errors import ConfigError


@dataclass
class _Entry:
    tokens: np.ndarray  # the ids whose KV ``cache`` holds (int64, length cache.offset)
    cache: KVCache
    nbytes: int


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading ids two arrays share."""
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m


def _usable(cache: KVCache, common: int) -> int:
    """The largest offset <= ``common`` that ``cache`` can fork at (0: none)."""
    n = cache.reachable(min(common, cache.offset))
    return n if n >= cache.floor else 0


def _covers(a: KVCache, b: KVCache) -> bool:
    """Whether ``a`` (holding ``b``'s tokens and maybe more) can fork at every offset ``b`` can:
    both return to any offset down to their ``floor`` (a cache that keeps some offsets only,
    ``HybridCache``, is never said to cover or be covered), and ``a``'s floor is no later."""
    anywhere = all(type(c).reachable is KVCache.reachable for c in (a, b))
    return anywhere and a.floor <= b.floor


class PrefixStore:
    """Stored KV caches by token prefix, LRU-evicted under ``budget_bytes`` (module docstring).

    Counters: ``hits`` / ``misses`` (``take`` calls that reused a prefix / did not) and
    ``hit_tokens`` (prompt tokens whose KV was reused).
    """

    def __init__(self, budget_bytes: int):
        if not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ConfigError(f"prefix cache budget must be a number of bytes >= 0, "
                              f"got {budget_bytes!r}")
        self.budget = budget_bytes
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._next = 0
        self.nbytes = 0
        self.hits = self.misses = self.hit_tokens = 0

    @property
    def entries(self) -> int:
        return len(self._entries)

    def take(self, ids: list[int], make_cache: Callable[[], KVCache]) -> tuple[KVCache, int]:
        """A cache the caller owns, holding the KV of the longest usable stored prefix of
        ``ids[:-1]``, and that prefix's length; ``(make_cache(), 0)`` on a miss."""
        query = np.asarray(ids[:-1], dtype=np.int64)
        best, best_n, whole = None, 0, False
        for key in reversed(self._entries):  # most recent first: ties keep the most recent
            e = self._entries[key]
            n = _usable(e.cache, _common(query, e.tokens))
            if n > best_n or (n == best_n and n and not whole and n == e.cache.offset):
                best, best_n, whole = key, n, n == e.cache.offset
        if best is None:
            self.misses += 1
            return make_cache(), 0
        self.hits += 1
        self.hit_tokens += best_n
        if whole:
            return self._drop(best).cache, best_n
        self._entries.move_to_end(best)
        return self._entries[best].cache.fork(best_n), best_n

    def put(self, seq: list[int], cache: KVCache) -> None:
        """Keep ``cache`` (the KV of ``seq[:-1]``; the store owns it now), then drop least
        recently used entries until ``nbytes`` fits the budget. Not kept: a cache whose offset
        is not ``len(seq) - 1``, an empty one, one larger than the budget, one that a stored
        entry extends (that entry counts as used instead)."""
        if cache.offset != len(seq) - 1 or cache.offset == 0:
            return
        tokens = np.asarray(seq[:-1], dtype=np.int64)
        for key, e in list(self._entries.items()):
            common = _common(tokens, e.tokens)
            if common == len(tokens) and _covers(e.cache, cache):
                self._entries.move_to_end(key)  # e serves every lookup the new one would
                return
            if common == len(e.tokens) and _covers(cache, e.cache):
                self._drop(key)  # the new one serves every lookup e would
        size = cache.nbytes
        if size > self.budget:
            return
        self._entries[self._next] = _Entry(tokens, cache, size)
        self._next += 1
        self.nbytes += size
        while self.nbytes > self.budget:
            self._drop(next(iter(self._entries)))

    def fit(self, budget_bytes: int) -> None:
        """Set the budget (the room the running requests leave) and drop least recently used
        entries until the store fits it."""
        self.budget = max(0, int(budget_bytes))
        while self.nbytes > self.budget and self._entries:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        """Drop every entry (the counters stay)."""
        self._entries.clear()
        self.nbytes = 0

    def _drop(self, key: int) -> _Entry:
        e = self._entries.pop(key)
        self.nbytes -= e.nbytes
        return e
