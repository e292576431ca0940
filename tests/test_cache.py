"""KVCache: commit(path) gathers, trim rolls back, sliding windows stay exact or refuse."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec.cache import KVCache
from edgespec.errors import CacheRollbackError


def _kv(values):
    """Keys/values (1, 1, N, 1) whose single feature is the given numbers."""
    a = mx.array(np.array(values, dtype=np.float32).reshape(1, 1, -1, 1))
    return a, a * 10


def _write(cache, values):
    cache.reserve(len(values))
    k, v = _kv(values)
    for layer in range(cache.num_layers):
        cache.write(layer, k, v)


def _keys(cache, layer=0):
    return np.array(cache.keys[layer][0, 0, : cache.slots(layer), 0]).tolist()


def test_commit_path_gathers_accepted_nodes():
    cache = KVCache(num_layers=2)
    _write(cache, [1, 2, 3])
    cache.commit()
    _write(cache, [10, 11, 12, 13, 14])  # a tree; keep nodes 0, 2, 4
    cache.commit([0, 2, 4])
    assert _keys(cache) == [1, 2, 3, 10, 12, 14]
    assert np.array(cache.values[1][0, 0, :6, 0]).tolist() == [10, 20, 30, 100, 120, 140]
    assert cache.offset == 6


def test_chain_prefix_commit_and_trim():
    cache = KVCache(num_layers=1)
    _write(cache, [1, 2, 3, 4])
    cache.commit([0, 1])
    assert _keys(cache) == [1, 2]
    cache.trim(1)
    assert _keys(cache) == [1]
    _write(cache, [7])
    cache.commit()
    assert _keys(cache) == [1, 7]
    with pytest.raises(CacheRollbackError, match="cannot trim 5"):
        cache.trim(5)


def test_growth_keeps_committed_entries():
    cache = KVCache(num_layers=1)
    for start in range(0, 600, 100):
        _write(cache, list(range(start, start + 100)))
        cache.commit()
    assert _keys(cache) == list(range(600))


def test_sliding_window_compaction_keeps_positions_and_limits_rollback():
    cache = KVCache(num_layers=1, window=4, rollback=3)
    for t in range(300):
        _write(cache, [t])
        cache.commit()
    assert cache.offset == 300
    assert cache.start > 0, "old entries should have been dropped"
    keys = _keys(cache)
    assert keys == list(range(cache.start, 300))
    assert cache.key_positions().tolist() == keys
    cache.trim(3)  # within what the window still allows
    with pytest.raises(CacheRollbackError, match="sliding-window"):
        cache.trim(cache.slots(0))


def test_per_layer_policy_global_keeps_everything_sliding_compacts():
    """Gemma's layout: a sliding layer (window 4) next to a global one. The sliding layer
    compacts on its own; rollback stays exact within ``rollback`` and is refused beyond it only
    because of the sliding layer; a tree commit gathers each layer at its own slots."""
    cache = KVCache(num_layers=2, window=[4, None], rollback=3)
    for t in range(300):
        _write(cache, [t])
        cache.commit()
    assert cache.offset == cache.offset == 300
    assert cache.starts[0] > 0 and cache.starts[1] == 0
    assert _keys(cache, 0) == list(range(cache.starts[0], 300))
    assert _keys(cache, 1) == list(range(300))
    assert cache.mask_groups() == [(4, cache.starts[0]), (None, 0)]
    cache.trim(3)
    _write(cache, [1000, 1001, 1002])  # a tree after the rollback: keep nodes 0 and 2
    cache.commit([0, 2])
    assert _keys(cache, 0)[-3:] == [296, 1000, 1002] and _keys(cache, 1)[-3:] == [296, 1000, 1002]
    with pytest.raises(CacheRollbackError, match="sliding-window"):
        cache.trim(cache.slots(0))
    cache.trim(0)
    global_only = KVCache(num_layers=1, window=[None], rollback=3)
    for t in range(300):
        _write(global_only, [t])
        global_only.commit()
    global_only.trim(299)  # no sliding layer: any depth rolls back
    assert _keys(global_only) == [0]


def test_window_list_must_match_the_layers():
    with pytest.raises(ValueError, match="2 entries for 3 layers"):
        KVCache(num_layers=3, window=[4, None])


def test_a_long_first_forward_keeps_what_it_writes():
    """A prefill longer than window + rollback + 256 slots into an empty sliding cache: nothing
    is committed yet, so nothing may be dropped before it is written."""
    cache = KVCache(num_layers=2, window=[4, None], rollback=3)
    _write(cache, list(range(400)))
    cache.commit()
    assert cache.starts == [0, 0] and _keys(cache, 0) == list(range(400))
    _write(cache, [400])  # the next forward compacts the sliding layer only
    cache.commit()
    assert cache.starts[0] > 0 and cache.starts[1] == 0
    assert _keys(cache, 0) == list(range(cache.starts[0], 401))
