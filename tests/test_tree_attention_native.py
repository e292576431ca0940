"""The native CPU tree attention (kernels/tree_attention.py, native/attention_core.inc) against
its pure-MLX twin, on every ISA this CPU has: random trees and chains of 1..64 nodes, no cached
key to hundreds, grouped-query ratios 1 and 3, odd head sizes, windows that cut through the
cache and the tree, logit capping. Tolerance (stated in kernels/tree_attention.py): 2e-6 of
max |v|. A node's result is bit-identical whatever other nodes come with it (plain decoding and
verification must agree), and the engine's forwards go through the kernel.
"""

from __future__ import annotations

from contextlib import contextmanager

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec import Engine
from edgespec.kernels import backend
from edgespec.kernels import tree_attention as ta
from edgespec.kernels.tree_mask import tree_mask
from edgespec.targets.decoder import Decoder
from edgespec.tree import DraftTree

from .test_kernels import mod  # noqa: F401  (the fixture: the module, or skip / fail)

TOL = 2e-6


def _random_tree(rng, n: int) -> DraftTree | None:
    if n == 1 or rng.random() < 0.3:
        return None  # a chain
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    return DraftTree(list(range(n)), parents)


def _case(rng, n, cached, heads, ratio, d, window, offset_pad=7):
    q = mx.array(rng.standard_normal((1, heads * ratio, n, d), dtype=np.float32))
    s = cached + n
    big = rng.standard_normal((1, heads, s + offset_pad, d), dtype=np.float32)
    k = mx.array(big)[:, :, :s, :]  # a slice, as cache.write returns it
    v = mx.array(rng.standard_normal((1, heads, s, d), dtype=np.float32))
    start = int(rng.integers(0, 50))
    tree = _random_tree(rng, n)
    return q, k, v, tree_mask(tree, n, start, start + cached, window)


def _isas(m):
    return [i for i in ("avx512", "avx2", "generic") if i in m.supported_isas().split(",")]


@contextmanager
def _on_isa(m, isa: str):
    """Runs the block with the kernels' ISA set to ``isa`` (the test is skipped on a CPU
    without it), then restores the one before."""
    if isa not in m.supported_isas().split(","):
        pytest.skip(f"no {isa} on this CPU")
    before = m.isa()
    m.set_isa(isa)
    try:
        yield
    finally:
        m.set_isa(before)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(n=st.sampled_from([1, 2, 5, 17, 64]), cached=st.sampled_from([0, 1, 33, 300]),
       heads=st.integers(1, 3), ratio=st.sampled_from([1, 3]), d=st.sampled_from([16, 64, 80]),
       window=st.sampled_from([None, 1, 8, 40]), softcap=st.sampled_from([None, 5.0]),
       seed=st.integers(0, 2**31 - 1))
def test_kernel_equals_twin(mod, n, cached, heads, ratio, d, window, softcap, seed):  # noqa: F811
    rng = np.random.default_rng(seed)
    q, k, v, mask = _case(rng, n, cached, heads, ratio, d, window)
    want = np.array(ta.tree_attention_twin(q, k, v, 0.3, mask, softcap))
    before = mod.isa()
    try:
        for isa in _isas(mod):
            mod.set_isa(isa)
            got = np.array(ta.tree_attention_native(q, k, v, 0.3, mask, softcap))
            assert np.abs(got - want).max() <= TOL * np.abs(np.array(v)).max(), isa
    finally:
        mod.set_isa(before)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("kv_heads", [2, 6])
def test_a_node_gets_the_same_bits_alone_as_in_a_tree(mod, kv_heads, isa):  # noqa: F811
    """With 6 query heads over 2 kv heads the node alone is attended with the other heads of
    its kv head (the AVX-512 and AVX2 code's tiles of up to 12 queries); over 6 kv heads it is
    alone in its tile (the one-query path), while the tree's nodes go in tiles either way."""
    with _on_isa(mod, isa):
        _node_alone_and_in_a_tree(kv_heads)


def _node_alone_and_in_a_tree(kv_heads: int) -> None:
    rng = np.random.default_rng(3)
    tree = DraftTree(list(range(9)), [-1, 0, 0, 1, 1, 2, 3, 6, 4])
    L, d = 150, 64
    q = mx.array(rng.standard_normal((1, 6, 9, d), dtype=np.float32))
    k = mx.array(rng.standard_normal((1, kv_heads, L + 9, d), dtype=np.float32))
    v = mx.array(rng.standard_normal((1, kv_heads, L + 9, d), dtype=np.float32))
    whole = ta.tree_attention_native(q, k, v, 0.125, tree_mask(tree, 9, 0, L, None))
    for node in (0, 3, 7):
        path = tree.path_to(node)  # root .. node: what plain decoding would have committed
        idx = mx.array(list(range(L)) + [L + u for u in path])
        alone = ta.tree_attention_native(q[:, :, node : node + 1], k[:, :, idx], v[:, :, idx],
                                         0.125, tree_mask(None, 1, 0, L + len(path) - 1, None))
        assert mx.array_equal(alone[:, :, 0], whole[:, :, node]).item(), node


def test_bad_inputs_raise_kernel_error(mod):  # noqa: F811
    rng = np.random.default_rng(4)
    q, k, v, mask = _case(rng, 3, 10, 2, 1, 16, None)
    with pytest.raises(backend.KernelError, match="nodes"):
        ta.tree_attention_native(q[:, :, :2], k, v, 1.0, mask)
    with pytest.raises(backend.KernelError, match="float32"):
        ta.tree_attention_native(q.astype(mx.float16), k.astype(mx.float16),
                                 v.astype(mx.float16), 1.0, mask)


def test_decoding_attends_through_the_kernel(mod, target, monkeypatch):  # noqa: F811
    calls = []
    real = ta.tree_attention_native
    monkeypatch.setattr(ta, "tree_attention_native", lambda *a, **kw: calls.append(a[0].shape[2]) or real(*a, **kw))
    block = mod.decoder_block  # float blocks run whole as one native op, attention included
    monkeypatch.setattr(Decoder, "_stack_for", lambda *a: None)  # one such op per layer
    monkeypatch.setattr(mod, "decoder_block", lambda arrays, *a, **kw: calls.append(
        arrays[0].shape[0]) or block(arrays, *a, **kw))
    plain = Engine(target).generate("the cat sat on the mat", max_tokens=6)
    sizes = calls  # nodes per call: the short prompt's, then one per step
    steps = len(plain.token_ids) - 1  # forwards after the prompt's
    assert sizes.count(1) >= steps * target.num_layers and max(sizes) <= 64
    # the same forward with the native kernels off (the twin): the same logits, within rounding
    ids = Engine(target).encode("the cat sat on the mat")

    def logits():
        cache = target.make_cache()
        return np.array(target.score(ids, cache).logits)

    with_kernel = logits()
    backend.set_native_enabled(False)
    try:
        without = logits()
    finally:
        backend.set_native_enabled(True)
    np.testing.assert_allclose(with_kernel, without, atol=1e-4)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("d", [64, 48, 40])
def test_a_keys_score_does_not_depend_on_how_many_keys_are_cached(mod, isa, d):  # noqa: F811
    """Plain decoding and a verify see different cached-key counts L for the same node: its
    output must have the same bits. 50 keys, the node seeing all of them: as the one new token
    after 49 cached keys, and as the last of a 9-token chain after 41 (the AVX-512 code scores
    runs of 16 cached keys at once, and key 40 falls in such a run only in the first case)."""
    with _on_isa(mod, isa):
        rng = np.random.default_rng(7)
        heads, S = 3, 50
        k = mx.array(rng.standard_normal((1, 1, S, d), dtype=np.float32))
        v = mx.array(rng.standard_normal((1, 1, S, d), dtype=np.float32))
        q_last = rng.standard_normal((1, heads, 1, d), dtype=np.float32)
        q_chain = np.concatenate([rng.standard_normal((1, heads, 8, d), dtype=np.float32), q_last], axis=2)
        one = ta.tree_attention_native(mx.array(q_last), k, v, 0.125, tree_mask(None, 1, 0, S - 1, None))
        nine = ta.tree_attention_native(mx.array(q_chain), k, v, 0.125, tree_mask(None, 9, 0, S - 9, None))
        assert mx.array_equal(one[:, :, 0], nine[:, :, 8]).item()


def test_a_chains_mask_is_the_trees_and_is_shared_read_only():
    """``tree_mask(None, n, ...)`` (a chain: its bits made once per length) equals the mask of
    the same chain given as a tree, for every length up to 64 (both words of the bitmask)."""
    for n in range(1, 65):
        chain = tree_mask(None, n, 3, 40, None)
        tree = tree_mask(DraftTree(list(range(n)), list(range(-1, n - 1))), n, 3, 40, None)
        assert np.array_equal(chain.anc, tree.anc) and np.array_equal(chain.qpos, tree.qpos)
        assert tree_mask(None, n, 0, 9, 4).anc is chain.anc and not chain.anc.flags.writeable


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
def test_a_window_that_hides_no_key_gives_the_bits_of_no_window(mod, isa):  # noqa: F811
    """A sliding window wider than the context is dropped before the kernel runs (so it takes
    the no-window paths): the output must have exactly the no-window bits, and a window one
    key narrower must still hide that key."""
    with _on_isa(mod, isa):
        rng = np.random.default_rng(11)
        n, cached, start = 9, 70, 5
        tree = DraftTree(list(range(n)), [-1, 0, 0, 1, 1, 2, 3, 6, 4])
        q = mx.array(rng.standard_normal((1, 6, n, 64), dtype=np.float32))
        k = mx.array(rng.standard_normal((1, 2, cached + n, 64), dtype=np.float32))
        v = mx.array(rng.standard_normal((1, 2, cached + n, 64), dtype=np.float32))
        mask = tree_mask(tree, n, start, start + cached, None)
        none = ta.tree_attention_native(q, k, v, 0.125, mask)
        deepest = int(np.argmax(np.array(mask.qpos)))  # node 7, 4 below the root
        span = int(np.array(mask.qpos)[deepest]) - start + 1  # its distance to cached key 0, + 1
        wide = ta.tree_attention_native(q, k, v, 0.125, tree_mask(tree, n, start, start + cached, span))
        assert mx.array_equal(wide, none).item()
        narrow = ta.tree_attention_native(q, k, v, 0.125, tree_mask(tree, n, start, start + cached, span - 1))
        assert not mx.array_equal(narrow[:, :, deepest], none[:, :, deepest]).item()  # key 0 hidden
        assert mx.array_equal(narrow[:, :, 0], none[:, :, 0]).item()  # the root still sees it


def test_a_window_is_kept_when_a_node_lies_before_the_cache(mod):  # noqa: F811
    """The window is dropped only when the span from the earliest position (cached key 0's or a
    node's) to the latest fits it: nodes at positions 0 and 10 after key_start 5, window 8,
    node 1 a child of node 0, must still hide node 0 from node 1 (10 - 0 >= 8), as the twin
    does."""
    from edgespec.kernels.tree_mask import TreeMask, ancestor_bits

    rng = np.random.default_rng(13)
    anc = ancestor_bits(np.array([[True, False], [True, True]]))
    mask = TreeMask(anc, np.array([0, 10], dtype=np.int32), 5, 0, 8)
    q = mx.array(rng.standard_normal((1, 2, 2, 64), dtype=np.float32))
    k = mx.array(rng.standard_normal((1, 1, 2, 64), dtype=np.float32))
    v = mx.array(rng.standard_normal((1, 1, 2, 64), dtype=np.float32))
    got = np.array(ta.tree_attention_native(q, k, v, 0.125, mask))
    want = np.array(ta.tree_attention_twin(q, k, v, 0.125, mask))
    np.testing.assert_allclose(got, want, atol=TOL * 10)
    # node 1 sees only its own key: its output is that value row, exactly
    np.testing.assert_array_equal(got[0, :, 1], np.broadcast_to(np.array(v)[0, 0, 1], (2, 64)))
