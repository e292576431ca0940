"""The KV cache: committed tokens, a scratch region for the tree being scored, cheap rollback.

Layout per layer: ``keys/values`` of shape (B, H_kv, capacity, D). Slots ``[0, length)`` hold
committed tokens, slot ``s`` at absolute position ``start + s``. A forward over N tree nodes
writes their keys/values into the scratch slots ``[length, length + N)`` (``write``) without
committing anything; only the engine (or a drafter, for its own cache) then calls

- ``commit(path)``: keep the accepted tree nodes — one gather moving them to contiguous slots
  (free for a chain prefix) — and advance ``length``;
- ``trim(n)``: forget the last ``n`` committed tokens (O(1)).

Sliding-window (rotating) attention uses the same class with ``window`` set: the mask (built in
``tree.attention_mask`` from absolute positions) hides keys that left the window, and when the
buffer fills up the oldest entries are dropped in one slice, keeping ``window + rollback`` of
them so a later ``trim`` of up to ``rollback`` tokens is still exact. A deeper trim raises
:class:`CacheRollbackError` instead of silently attending to the wrong keys.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .errors import CacheRollbackError

_STEP = 256


class KVCache:
    def __init__(self, num_layers: int, window: int | None = None, rollback: int = 64):
        self.num_layers = num_layers
        self.window = window
        self.rollback = rollback
        self.keys: list[mx.array | None] = [None] * num_layers
        self.values: list[mx.array | None] = [None] * num_layers
        self.start = 0  # absolute position of slot 0
        self.length = 0  # committed slots
        self._scratch = 0  # slots written by the current forward

    @property
    def offset(self) -> int:
        """Absolute position of the next token to commit."""
        return self.start + self.length

    @property
    def capacity(self) -> int:
        k = self.keys[0]
        return 0 if k is None else k.shape[2]

    def key_positions(self) -> np.ndarray:
        return np.arange(self.start, self.start + self.length)

    def reserve(self, n: int) -> None:
        """Make room for a forward over ``n`` new tokens; call it before building the mask,
        since it may drop entries that left the window (idempotent for the same ``n``)."""
        self._scratch = n
        if self.window is not None and self.length + n > self.window + self.rollback + _STEP:
            self._compact()

    def _compact(self) -> None:
        keep = self.window + self.rollback
        drop = self.length - keep
        if drop <= 0:
            return
        for i in range(self.num_layers):
            self.keys[i] = self.keys[i][:, :, drop:, :]  # scratch slots too (see LowerLayers)
            self.values[i] = self.values[i][:, :, drop:, :]
        self.start += drop
        self.length = keep

    def write(self, layer: int, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Store a forward's keys/values (B, H_kv, N, D) in the scratch slots of ``layer``.

        Returns all keys/values the forward attends to: committed slots plus these N.
        """
        n = k.shape[2]
        a, b = self.length, self.length + n
        if self.keys[layer] is None or b > self.keys[layer].shape[2]:
            self._grow(layer, k, v, b)
        self.keys[layer][..., a:b, :] = k
        self.values[layer][..., a:b, :] = v
        return self.keys[layer][..., :b, :], self.values[layer][..., :b, :]

    def _grow(self, layer: int, k: mx.array, v: mx.array, needed: int) -> None:
        B, H, _, D = k.shape
        size = ((needed + _STEP - 1) // _STEP) * _STEP
        old_k, old_v = self.keys[layer], self.values[layer]
        new_k = mx.zeros((B, H, size, D), dtype=k.dtype)
        new_v = mx.zeros((B, H, size, v.shape[3]), dtype=v.dtype)
        if old_k is not None:
            new_k[..., : self.length, :] = old_k[..., : self.length, :]
            new_v[..., : self.length, :] = old_v[..., : self.length, :]
        self.keys[layer], self.values[layer] = new_k, new_v

    def commit(self, path: list[int] | None = None) -> None:
        """Keep scratch nodes ``path`` (default: all of them, in order) as committed tokens."""
        n = self._scratch if path is None else len(path)
        if path is not None and path != list(range(n)):
            idx = mx.array([self.length + i for i in path])
            a = self.length
            for i in range(self.num_layers):
                self.keys[i][..., a : a + n, :] = self.keys[i][..., idx, :]
                self.values[i][..., a : a + n, :] = self.values[i][..., idx, :]
        self.length += n
        self._scratch = 0

    def trim(self, n: int) -> None:
        """Forget the last ``n`` committed tokens."""
        if n <= 0:
            return
        if self.window is not None and self.start > 0 and self.length - n < self.window - 1:
            raise CacheRollbackError(
                f"sliding-window cache cannot roll back {n} tokens: entries older than the window "
                f"were dropped (at most {self.length - self.window + 1} can be rolled back); "
                f"raise rollback above {n}")
        if n > self.length:
            raise CacheRollbackError(f"cannot trim {n} tokens from a cache holding {self.length}")
        self.length -= n

    def state(self) -> list[mx.array]:
        """Arrays to evaluate so that pending writes are materialised."""
        return [a for a in self.keys + self.values if a is not None]
