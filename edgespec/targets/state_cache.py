"""HybridCache: the KV cache of a model whose layers are attention or recurrent (gated DeltaNet,
short convolutions), with the KV cache's contract: a forward writes scratch, ``commit(path)``
keeps the accepted nodes, ``trim(n)`` forgets the last ``n`` committed tokens.

Attention slots are :class:`KVCache`'s, unchanged. A recurrent slot holds no keys: it holds a
*state* (a tuple of arrays: the convolution's window of recent inputs, and the recurrence's
matrix where the layer has one), and a forward through it does not append rows but derives each
node's state from its parent's (the forward's tree comes with ``reserve(n, tree)``; a chain's
parent is the previous node). What a forward leaves is a :class:`Scratch` (``write_state``)
that can say the state after any of its nodes; ``commit(path)`` asks it for the state after the
path's last node (``recurrent.KeptStates``: the state each node got in the forward, kept).
Only a forward over a DraftTree (``reserve(n, tree)`` with a tree: ``per_node``) keeps every
node's state, as only a draft may be accepted in part; tokens passed as a list (a prefill
chunk, a drafter's feed) are committed whole, and their forward keeps its last state only.

A state cannot be trimmed, so the cache keeps the states it committed, by offset (the
*timeline*), and ``trim(n)`` moves back to a kept one. A state is a full copy of the recurrent
matrices (a Qwen3-Next-80B: 72 MiB), so only those a rollback asks for are kept:

- the last ``states`` (2) commit boundaries: the engine's pipelined plain decoding trims the
  forward past the end (``trim(1)``);
- the pinned one (``pin``, until the next pin): the engine pins the end of each prompt's
  prefill, so the next request sharing that prompt (a chat's next turn) reuses it
  (``reachable`` says where a trim can go);
- every boundary from the held offset on (``hold``, until the next hold): an owner that commits
  a run of single tokens and trims back into it (``LowerLayers``' feeds, a draft model's
  drafts) holds at the run's start;
- offset 0 (the zero state) and states past the offset (a forward replaces them).

A trim to anywhere else raises :class:`CacheRollbackError` (the engine's prefix reuse then
starts a fresh cache). As with the keys a trim leaves in their slots, states past the offset stay until a forward through that
slot replaces them: ``LowerLayers`` feeds its chain through the lower layers one committed
token at a time, trims back, verifies the upper layers only and commits the accepted prefix,
and the lower slots then step forward along the states their feeds left.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import mlx.core as mx

from ..cache import KVCache
from ..errors import CacheRollbackError

State = tuple  # a recurrent slot's arrays, the layer's own layout; None: the zero state


class Scratch(Protocol):
    """What a forward through a recurrent slot leaves: the state after node ``u``."""

    def after(self, u: int) -> State: ...


class HybridCache(KVCache):
    def __init__(self, num_layers: int, recurrent: Sequence[int], states: int = 2, **kv):
        super().__init__(num_layers, **kv)
        self.recurrent = tuple(sorted(recurrent))
        self.owners = [i for i in self.owners if i not in self.recurrent]
        self.states = states  # the last commit boundaries kept per recurrent slot
        self.tree = None  # the current forward's DraftTree (None: a chain)
        self.per_node = False  # whether the current forward keeps every node's state
        self._pinned: int | None = None
        self._held: int | None = None
        self._timeline: dict[int, dict[int, State | None]] = {i: {0: None} for i in self.recurrent}
        self._written: dict[int, Scratch] = {}

    def pin(self) -> None:
        """Keep the states at the current offset until the next pin (``KVCache.pin``)."""
        self._pinned = self.offset

    def hold(self) -> None:
        """Keep the states at every commit from the current offset on until the next hold."""
        self._held = self.offset

    def reachable(self, offset: int) -> int:
        """The largest offset <= ``offset`` at which every recurrent slot keeps a state."""
        common = set.intersection(*(set(line) for line in self._timeline.values()))
        limit = min(super().reachable(offset), self.offset)
        return max(o for o in common if o <= limit)  # offset 0 is always kept

    def fork(self, n: int) -> HybridCache:
        """``KVCache.fork`` at an offset where every recurrent slot keeps a state
        (``reachable(n) == n``, else :class:`CacheRollbackError`); the fork keeps that state
        (pinned) and the zero state. States are never updated in place, so the two share them."""
        if self.reachable(n) != n:
            raise CacheRollbackError(f"cannot fork at offset {n}: the recurrent states are kept "
                                     f"only up to offset {self.reachable(n)} there")
        new = super().fork(n)
        new.tree, new.per_node, new._held, new._written = None, False, None, {}
        new._pinned = n
        new._timeline = {i: {0: None, n: line[n]} for i, line in self._timeline.items()}
        return new

    def held(self) -> tuple[int, int]:
        """(states, bytes) the recurrent slots hold now: one state per kept commit boundary per
        slot, plus the per-node states the current forward keeps until its commit."""
        arrays: dict[int, mx.array] = {}
        count = 0
        for line in self._timeline.values():
            for st in (st for st in line.values() if st is not None):
                count += 1
                arrays.update((id(a), a) for a in st)
        for scratch in self._written.values():
            nodes = getattr(scratch, "states", None) or {}
            count += len(nodes)
            arrays.update((id(a), a) for a in nodes.values())
        return count, sum(a.nbytes for a in arrays.values())

    def reserve(self, n: int, tree=None) -> None:
        super().reserve(n, tree)
        self.per_node = tree is not None  # a draft may be accepted in part; a list of tokens not
        self.tree = None if tree is None or tree.is_chain else tree
        self._written = {}

    def state(self) -> list[mx.array]:
        """``KVCache.state`` plus the recurrent slots' committed states."""
        held = [a for i in self.recurrent for a in (self._timeline[i].get(self.offset) or ())]
        return super().state() + [a for a in held if a is not None]

    def committed(self, slot: int) -> State | None:
        """The committed state of recurrent ``slot`` (None: zeros, nothing seen yet)."""
        line = self._timeline[slot]
        assert self.offset in line, f"recurrent slot {slot} has no state at offset {self.offset}"
        return line[self.offset]

    def write_state(self, slot: int, scratch: Scratch) -> None:
        """Record what this forward computed for ``slot``; the states past the committed
        offset that an earlier forward left there are now stale."""
        line = self._timeline[slot]
        for o in [o for o in line if o > self.offset]:
            del line[o]
        self._written[slot] = scratch

    def commit(self, path: list[int] | None = None) -> None:
        n = self._scratch if path is None else len(path)
        end = self.offset + n
        assert not path or path == (self.tree.path_to(path[-1]) if self.tree is not None
                                    else list(range(n))), f"{path} is not a root path"
        for i in self.recurrent:
            line = self._timeline[i]
            if i in self._written and n:
                line[end] = self._written[i].after(n - 1 if path is None else path[-1])
            # a slot this forward did not run steps along the states an earlier one left
            # (LowerLayers' upper slots have none for its provisional feeds: trimmed before use)
        super().commit(path)
        self._written = {}
        self._prune()

    def _prune(self) -> None:
        """Drop the committed states no rollback asks for (see the module docstring)."""
        for line in self._timeline.values():
            past = sorted(o for o in line if o <= self.offset)
            keep = {0, self._pinned, *past[-self.states:]}
            for o in past:
                if o not in keep and (self._held is None or o < self._held):
                    del line[o]

    def trim(self, n: int) -> None:
        if n <= 0:
            return
        back = self.offset - n
        for i in self.recurrent:
            if back not in self._timeline[i]:
                held = sorted(o for o in self._timeline[i] if o <= self.offset)
                raise CacheRollbackError(
                    f"recurrent layer state cannot roll back {n} tokens (to offset {back}): it is "
                    f"kept only at offsets {held} (the last {self.states} commits, the pinned "
                    "prompt end, a held run of commits)")
        super().trim(n)
