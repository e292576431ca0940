"""The KV cache: committed tokens, a scratch region for the tree being scored, cheap rollback.

Layout per layer: ``keys/values`` of shape (B, H_kv, capacity, D). ``offset`` tokens are
committed; layer ``i`` holds positions ``[starts[i], offset)`` in slots ``[0, offset - starts[i])``
(``starts[i]`` is 0 unless that layer dropped old entries). A forward over N tree nodes writes
their keys/values into the N slots after those (``write``) without committing anything; only the
engine (or a drafter, for its own cache) then calls

- ``commit(path)``: keep the accepted tree nodes, moved to contiguous slots (free for a chain
  prefix), and advance ``offset``. ``move``, when given, moves them in every buffer at once and
  may decline (None); else each buffer gathers the rows (``gather``, when given, fetches them)
  and stores them with a slice update. The target's caches take both from
  ``kernels/compact.py``: on the CPU the native move, one operation a buffer, which writes only
  the moved rows where the buffer is the cache's alone (the slice update after a gather can find
  the buffer still held by it, and then copies the whole layer), and a Metal kernel's gather
  where those run;
- ``trim(n)``: forget the last ``n`` committed tokens (O(1)).

**Written in place.** The native decoder stack (``targets/decoder.py``'s ``_run_stack``) writes
a forward's rows straight into the buffers when the cache may give them up: no array it handed
out (``keys`` / ``values``) or a fork's view may still hold them (``in_place_buffers``). The
arrays then stay the same while their memory changes, so the cache keeps an output of the
writing operation (``wrote``): the next stack forward runs after it, ``state`` includes it, and
every other use of the buffers first makes them depend on it (``_settle``, one ``mx.depends``).
Otherwise (some layer's arrays lent, until an operation gives that layer new buffers) the
forward's rows go in by slice updates, functional as every other write here.

**Cache policy per layer.** ``window`` is None (every layer attends to everything), one int
(every layer slides, as in Mistral) or one entry per layer (Gemma: sliding layers interleaved
with global ones). A global layer keeps every entry. A sliding layer's keys that left its window
are hidden by the mask (built in ``tree.attention_mask`` from ``key_positions(layer)``), and when
its buffer fills up the oldest entries are dropped in one slice, keeping ``window + rollback`` of
them, so that a later ``trim`` of up to ``rollback`` tokens is still exact. A deeper trim raises
:class:`CacheRollbackError` instead of silently attending to the wrong keys. Layers with the same
window compact together, so they share one mask.

**Shared layers.** ``sources[i]`` is the layer whose keys/values layer ``i`` attends to (Gemma 4:
the last layers reuse an earlier layer's). A shared layer holds nothing of its own: it reads its
source's entries (``read``), including the scratch rows the source wrote in the same forward,
and its window and ``starts`` entry follow its source's. ``reserve``, ``commit`` and ``trim``
act on the layers that own entries only, so a shared layer's view stays its source's, exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from .errors import CacheRollbackError

_STEP = 256


class KVCache:
    def __init__(self, num_layers: int, window: int | None | Sequence[int | None] = None,
                 rollback: int = 64, gather=None, sources: Sequence[int] | None = None,
                 move=None):
        windows = list(window) if isinstance(window, Sequence) else [window] * num_layers
        if len(windows) != num_layers:
            raise ValueError(f"window has {len(windows)} entries for {num_layers} layers")
        sources = list(range(num_layers)) if sources is None else list(sources)
        if len(sources) != num_layers or any(
                not 0 <= s <= i or sources[s] != s for i, s in enumerate(sources)):
            raise ValueError(f"sources {sources} must name, per layer, itself or an earlier "
                             "layer that owns its entries")
        self.num_layers = num_layers
        self.sources: tuple[int, ...] = tuple(sources)
        self.owners = [i for i, s in enumerate(sources) if s == i]
        windows = [windows[s] for s in sources]  # a shared layer slides with its source
        self.windows: tuple[int | None, ...] = tuple(windows)
        self.rollback = rollback
        self.gather = gather  # (keys, values, first, path) -> the rows first + path[j]
        self.move = move  # (buffers, firsts, path) -> the buffers with the rows moved, or None
        self._keys: list[mx.array | None] = [None] * num_layers
        self._values: list[mx.array | None] = [None] * num_layers
        self.starts = [0] * num_layers  # absolute position held in slot 0, per layer
        self.offset = 0  # committed tokens: absolute position of the next one
        self._scratch = 0  # slots written by the current forward
        # An output of the operation that last wrote the buffers in place (``wrote``), while
        # nothing else depends on it; and, per layer, whether its arrays may be held or viewed
        # elsewhere (handed out by ``keys`` / ``values``, or viewed by a fork), until new ones
        # replace them (``set_buffers``).
        self._writer: mx.array | None = None
        self._lent = [False] * num_layers

    # ---- the buffers ------------------------------------------------------------------------
    #
    # ``keys[i]`` / ``values[i]``: layer i's buffers (1, heads, capacity, dim), or None. The
    # native decoder stack may write a forward's rows into them in place (``in_place_buffers``,
    # ``wrote``): the arrays then stay the same while their memory changes, so until something
    # reads them, the cache holds the writing operation's output and ``keys`` / ``values`` first
    # make every buffer depend on it (one ``mx.depends``): whatever reads them afterwards runs
    # after the writes. A stack forward that follows takes the writer as a dependency instead.

    @property
    def keys(self) -> list[mx.array | None]:
        """The layers' key buffers (a new list), for reading: whoever takes them may hold
        them, so no forward writes these arrays in place (``_lent``)."""
        return self._lend(self._keys)

    @property
    def values(self) -> list[mx.array | None]:
        """The layers' value buffers (as ``keys``)."""
        return self._lend(self._values)

    def _lend(self, buffers: list[mx.array | None]) -> list[mx.array | None]:
        """``buffers`` (this cache's keys or values, settled in place) as a new list, every
        layer marked lent."""
        self._settle()
        self._lent = [True] * self.num_layers
        return list(buffers)

    def _settle(self) -> None:
        """Make every buffer depend on the pending in-place writer, if there is one."""
        if self._writer is None:
            return
        held = [i for i, k in enumerate(self._keys) if k is not None]
        after = mx.depends([self._keys[i] for i in held] + [self._values[i] for i in held],
                           [self._writer])
        for j, i in enumerate(held):
            self._keys[i], self._values[i] = after[j], after[len(held) + j]
        self._writer = None

    def _settled(self) -> tuple[list[mx.array | None], list[mx.array | None]]:
        """The buffers after any pending writer (``_settle``), for this cache's own use."""
        self._settle()
        return self._keys, self._values

    def in_place_buffers(self) -> tuple[bool, list[mx.array]]:
        """For a forward that may write the buffers in place (the native decoder stack):
        whether it may (no one else may hold or view the arrays: ``_lent``), and what it must
        run after (the pending writer)."""
        lent = any(self._lent[i] for i in self.owners)  # a sharer holds no buffers of its own
        return not lent, [] if self._writer is None else [self._writer]

    def wrote(self, writer: mx.array) -> None:
        """A forward wrote its rows into the buffers in place; ``writer`` is an output of the
        operation that did (see the buffers' note above)."""
        self._writer = writer

    @property
    def start(self) -> int:
        """The oldest position that every layer still holds."""
        return max(self.starts)

    @property
    def capacity(self) -> int:
        k = self._keys[0]
        return 0 if k is None else k.shape[2]

    def slots(self, layer: int) -> int:
        """Committed entries held by ``layer`` (a shared layer: by its source)."""
        return self.offset - self.starts[layer]

    def key_positions(self, layer: int = 0) -> np.ndarray:
        """Absolute positions of ``layer``'s committed entries, slot by slot."""
        return np.arange(self.starts[layer], self.offset)

    def mask_groups(self) -> list[tuple[int | None, int]]:
        """Per layer, what its mask depends on: (window, start). Equal entries share one mask."""
        return list(zip(self.windows, self.starts))

    def reserve(self, n: int, tree=None) -> None:
        """Make room for a forward over ``n`` new tokens; call it before building the mask,
        since it may drop entries that left a sliding window (idempotent for the same ``n``).
        ``tree``: the forward's DraftTree (a draft, which may be accepted in part), None for
        tokens committed whole (a prefill chunk, a drafter's feed); attention reads the tree
        from its mask, recurrent layers from the cache (``targets/state_cache.HybridCache``)."""
        self._scratch = n
        for i in self.owners:
            w = self.windows[i]
            drop = self.slots(i) - (w + self.rollback) if w is not None else 0
            if drop > 0 and self.slots(i) + n > w + self.rollback + _STEP:
                self._compact(i, drop)

    def _compact(self, layer: int, drop: int) -> None:
        keys, values = self._settled()
        if keys[layer] is not None:  # scratch slots move too (see LowerLayers)
            keys[layer] = keys[layer][:, :, drop:, :]
            values[layer] = values[layer][:, :, drop:, :]
        for j, s in enumerate(self.sources):  # the layer and those sharing its entries
            if s == layer:
                self.starts[j] += drop

    def write(self, layer: int, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Store a forward's keys/values (B, H_kv, N, D) in the scratch slots of ``layer``.

        Returns all keys/values the forward attends to: committed slots plus these N.
        """
        assert self.sources[layer] == layer, f"layer {layer} shares layer {self.sources[layer]}'s"
        n = k.shape[2]
        a = self.slots(layer)
        b = a + n
        keys, values = self._settled()
        if keys[layer] is None or b > keys[layer].shape[2]:
            self._grow(layer, (*k.shape[:2], k.shape[3], v.shape[3]), k.dtype, b)
        keys[layer][..., a:b, :] = k
        values[layer][..., a:b, :] = v
        return keys[layer][..., :b, :], values[layer][..., :b, :]

    def read(self, layer: int, n: int) -> tuple[mx.array, mx.array]:
        """What shared layer ``layer`` attends to in a forward over ``n`` tokens: its source's
        committed entries plus the ``n`` scratch rows the source wrote earlier in this forward."""
        s = self.sources[layer]
        b = self.slots(s) + n
        keys, values = self._settled()
        return keys[s][..., :b, :], values[s][..., :b, :]

    def write_buffers(self, layer: int, n: int, heads: int, dim: int,
                      dtype=mx.float32, in_place: bool = False) -> tuple[mx.array, mx.array, int]:
        """For an operation that writes a forward's keys/values itself (the native decoder
        block): ``layer``'s buffers (1, heads, capacity, dim), grown to hold ``n`` scratch rows
        after the committed ones, and where those rows go. Store what it returns with
        ``set_buffers``, or, where the operation writes them in place (``in_place``: the native
        stack, after ``in_place_buffers``' writer), tell the cache with ``wrote``."""
        a = self.slots(layer)
        keys, values = (self._keys, self._values) if in_place else self._settled()
        k, v = keys[layer], values[layer]
        if k is None or a + n > k.shape[2]:
            self._grow(layer, (1, heads, dim, dim), dtype, a + n)  # reads the rows: settled
            k, v = self._keys[layer], self._values[layer]
        return k, v, a

    def set_buffers(self, layer: int, keys: mx.array, values: mx.array) -> None:
        """Store an operation's new buffers of ``layer`` (``write_buffers``). Arrays that a
        functional operation returned are this cache's alone."""
        held_k, held_v = self._settled()
        held_k[layer], held_v[layer] = keys, values
        self._lent[layer] = False

    def _grow(self, layer: int, shape: tuple[int, int, int, int], dtype, needed: int) -> None:
        B, H, D, Dv = shape
        size = ((needed + _STEP - 1) // _STEP) * _STEP
        held_k, held_v = self._settled()
        old_k, old_v = held_k[layer], held_v[layer]
        new_k = mx.zeros((B, H, size, D), dtype=dtype)
        new_v = mx.zeros((B, H, size, Dv), dtype=dtype)
        if old_k is not None:
            a = self.slots(layer)
            new_k[..., :a, :] = old_k[..., :a, :]
            new_v[..., :a, :] = old_v[..., :a, :]
        held_k[layer], held_v[layer] = new_k, new_v

    def commit(self, path: list[int] | None = None) -> None:
        """Keep scratch nodes ``path`` (default: all of them, in order) as committed tokens."""
        n = self._scratch if path is None else len(path)
        if path is not None and path != list(range(n)) and not self._moved(path):
            keys, values = self._settled()
            for i in self.owners:
                a = self.slots(i)
                if self.gather is not None:
                    k, v = self.gather(keys[i], values[i], a, path)
                else:
                    idx = mx.array([a + j for j in path])
                    k, v = keys[i][..., idx, :], values[i][..., idx, :]
                keys[i][..., a : a + n, :] = k
                values[i][..., a : a + n, :] = v
        self.offset += n
        self._scratch = 0

    def _moved(self, path: list[int]) -> bool:
        """Move the rows of ``path`` in every owned buffer through ``move``; False where there
        is none or it declines (``commit`` then gathers)."""
        keys, values = self._settled()
        held = [i for i in self.owners if keys[i] is not None]
        if self.move is None or not held:
            return False
        firsts = [self.slots(i) for i in held]
        moved = self.move([keys[i] for i in held] + [values[i] for i in held],
                          firsts + firsts, path)
        if moved is None:
            return False
        for j, i in enumerate(held):
            keys[i], values[i] = moved[j], moved[len(held) + j]
        return True

    def trim(self, n: int) -> None:
        """Forget the last ``n`` committed tokens."""
        if n <= 0:
            return
        if n > self.offset:
            raise CacheRollbackError(f"cannot trim {n} tokens from a cache holding {self.offset}")
        for i in self.owners:
            w = self.windows[i]
            # the next query (position offset - n) needs keys from offset - n - w + 1 on
            if w is not None and self.starts[i] > 0 and self.slots(i) - n < w - 1:
                raise CacheRollbackError(
                    f"sliding-window cache cannot roll back {n} tokens: entries older than the "
                    f"window were dropped (at most {self.slots(i) - w + 1} can be rolled back); "
                    f"raise rollback above {n}")
        self.offset -= n

    def pin(self) -> None:
        """Keep ``trim`` able to return to the current offset until the next ``pin`` (the engine
        pins the end of a prompt for the next request's prefix reuse). Nothing to do here: a KV
        cache returns to any offset it holds; ``HybridCache`` keeps a recurrent state for it."""

    def hold(self) -> None:
        """Keep ``trim`` able to return to every commit from the current offset on until the
        next ``hold`` (the start of a run of single-token commits that its owner trims back
        into). Nothing to do here, as for ``pin``."""

    def reachable(self, offset: int) -> int:
        """The largest offset <= ``offset`` that ``trim`` can return to (a KV cache: ``offset``
        itself; a sliding window's limit is reported by ``trim``)."""
        return offset

    def state(self) -> list[mx.array]:
        """Arrays to evaluate so that pending writes are materialised (in-place ones: their
        writer)."""
        held = [a for a in self._keys + self._values if a is not None]
        return held if self._writer is None else held + [self._writer]

    @property
    def floor(self) -> int:
        """The smallest offset ``trim`` (and ``fork``) can return to: 0 unless a sliding layer
        dropped entries, then the first offset whose whole window that layer still holds."""
        return max([0] + [self.starts[i] + self.windows[i] - 1 for i in self.owners
                          if self.starts[i] > 0])

    @property
    def nbytes(self) -> int:
        """Bytes of the keys/values buffers the cache holds (the layers that own entries)."""
        return sum(a.nbytes for i in self.owners for a in (self._keys[i], self._values[i])
                   if a is not None)

    def fork(self, n: int) -> KVCache:
        """A new cache holding this one's first ``n`` committed tokens, exactly as ``trim`` would
        leave them; the two never share an array object. The fork's buffers are views of
        exactly its committed rows, so its first write grows into buffers of its own (``_grow``
        copies the rows) and this cache never sees what the fork writes, nor the fork what this
        one writes: both caches count as lent (``_lent``), so neither writes these arrays in
        place, and every other write is functional. ``n`` must
        lie in ``[floor, offset]`` (else :class:`CacheRollbackError`); a subclass with state
        of its own (``HybridCache``) extends it."""
        if not self.floor <= n <= self.offset:
            raise CacheRollbackError(f"cannot fork at offset {n}: this cache can return to "
                                     f"offsets {self.floor}..{self.offset}")
        new = copy.copy(self)
        keys, values = self._settled()  # the views come after any pending writer
        new._keys, new._values = list(keys), list(values)
        new._writer = None  # the views depend on it already (settled)
        self._lent, new._lent = [True] * self.num_layers, [True] * self.num_layers
        for i in self.owners:
            if keys[i] is not None:
                rows = n - self.starts[i]
                new._keys[i] = keys[i][..., :rows, :]
                new._values[i] = values[i][..., :rows, :]
        new.starts = list(self.starts)
        new.offset, new._scratch = n, 0
        return new
