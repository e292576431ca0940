"""The native row move that keeps a verified branch in the KV cache (native/move_rows.h,
kernels/compact.move_rows, KVCache.commit).

What is checked: the moved buffers equal what a gather and a slice update give (the twin,
``gather_rows_twin``), bit for bit, for float32, float16 and bfloat16 buffers, per-buffer first
slots and paths that skip rows; a buffer something else still holds is left as it was (the move
then works on a copy) while the cache's result is moved; a strided view is read through its
strides; bad paths and shapes are refused with a ValueError naming the problem, and declined by
``compact.move_rows`` (the cache then gathers); and a cache commits a branch the same with and
without the move.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec.cache import KVCache
from edgespec.kernels.compact import gather_rows_twin, move_rows

from .test_kernels import mod  # noqa: F401  (the fixture: the module, or skip / fail)


def _twin(buf: mx.array, first: int, path: list[int]) -> mx.array:
    rows, _ = gather_rows_twin(buf, buf, first, path)
    out = mx.array(buf)
    out[..., first:first + len(path), :] = rows
    return out


def _buffers(rng, n, heads, cap, dim, dtype):
    return [mx.array(rng.standard_normal((1, heads, cap, dim)).astype(np.float32)).astype(dtype)
            for _ in range(n)]


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_the_move_equals_a_gather_and_a_slice_update(mod, dtype):  # noqa: F811
    rng = np.random.default_rng(3)
    for path in ([0, 2, 5], [1, 2, 3], [0, 1, 7, 8], [4], [0, 3, 4, 9, 10, 11]):
        bufs = _buffers(rng, 4, 3, 24, 16, dtype)
        firsts = [5, 0, 9, 12]
        want = [_twin(b, a, path) for b, a in zip(bufs, firsts)]
        mx.eval(want)
        got = mod.move_rows(bufs, firsts, path)
        del bufs  # the cache lets go of its buffers as it stores the results
        assert all(mx.array_equal(g, w).item() for g, w in zip(got, want)), path


def test_a_buffer_held_elsewhere_is_left_as_it_was(mod):  # noqa: F811
    rng = np.random.default_rng(4)
    buf = _buffers(rng, 1, 2, 16, 8, mx.float32)[0]
    mx.eval(buf)
    before = np.array(buf)
    got = mod.move_rows([buf], [3], [0, 4, 6])[0]
    mx.eval(got)
    assert np.array_equal(np.array(buf), before)  # the caller's reference still reads the old rows
    assert mx.array_equal(got, _twin(buf, 3, [0, 4, 6])).item()


def test_a_strided_view_is_read_through_its_strides(mod):  # noqa: F811
    rng = np.random.default_rng(5)
    base = mx.array(rng.standard_normal((1, 16, 3, 8)).astype(np.float32))
    view = mx.transpose(base, (0, 2, 1, 3))  # (1, 3, 16, 8), not row-contiguous
    got = mod.move_rows([view], [2], [0, 5, 7])[0]
    assert mx.array_equal(got, _twin(mx.array(np.array(view)), 2, [0, 5, 7])).item()


@pytest.mark.parametrize("firsts, path, words", [
    ([0], [], "non-empty"),
    ([0], [-1, 2], "non-empty"),
    ([0], [0, 2, 2], "strictly increasing"),
    ([0], [3, 1], "strictly increasing"),
    ([10], [0, 6], "capacity 16"),
    ([0, 1], [0, 1], "one first slot per buffer"),
])
def test_bad_paths_are_refused_by_name(mod, firsts, path, words):  # noqa: F811
    buf = mx.zeros((1, 2, 16, 8))
    with pytest.raises(ValueError, match=words):
        mod.move_rows([buf], firsts, path)


def test_bad_shapes_are_refused_by_name(mod):  # noqa: F811
    with pytest.raises(ValueError, match=r"\(1, heads, capacity, dim\)"):
        mod.move_rows([mx.zeros((2, 16, 8))], [0], [0, 1])


def test_a_cache_commits_a_branch_the_same_with_and_without_the_move(mod):  # noqa: F811
    rng = np.random.default_rng(6)
    caches = [KVCache(3, move=move_rows), KVCache(3)]
    for n, path in ((7, None), (5, [0, 2, 3]), (4, [0, 1]), (6, [0, 3, 5])):
        rows = [(mx.array(rng.standard_normal((1, 2, n, 8)).astype(np.float32)),
                 mx.array(rng.standard_normal((1, 2, n, 8)).astype(np.float32))) for _ in range(3)]
        for cache in caches:
            cache.reserve(n)
            for layer, (k, v) in enumerate(rows):
                cache.write(layer, k, v)
            cache.commit(path)
    with_move, without = caches
    assert with_move.offset == without.offset == 7 + 3 + 2 + 3
    for a, b in zip(with_move.state(), without.state()):
        assert mx.array_equal(a[..., :with_move.offset, :], b[..., :without.offset, :]).item()


def test_what_the_operation_does_not_take_is_left_to_the_gather(mod):  # noqa: F811
    two = mx.zeros((2, 2, 16, 8))
    assert move_rows([two], [0], [0, 2]) is None  # a batch of two
    one = mx.zeros((1, 2, 16, 8))
    assert move_rows([one], [0], [0, 2, 2]) is None
    assert move_rows([one], [0], []) is None
    assert move_rows([one], [0], [0, 2]) is not None
    cache = KVCache(1, move=move_rows)
    rng = np.random.default_rng(7)
    k, v = (mx.array(rng.standard_normal((2, 2, 5, 8)).astype(np.float32)) for _ in range(2))
    cache.reserve(5)
    cache.write(0, k, v)
    cache.commit([0, 2, 4])  # the gather's way: the same rows
    assert mx.array_equal(cache.keys[0][..., :3, :], k[..., [0, 2, 4], :]).item()
