"""The Metal kernels (``kernels_metal/``) against their twins, run through the emulation.

Every kernel's own source is compiled with the system C++ compiler under
``kernels_metal/emulation/metal_emu.h`` and compared with the pure-MLX / numpy twin on random
inputs, awkward shapes included (1 node, 64 nodes, one cached key, none, a window boundary in
the cache and in the tree, GQA ratios 1 and 3, head sizes not a multiple of 32, float32 /
float16 / bfloat16). Tolerances: tree attention in float32 within 2e-5 of the twin; in float16
and bfloat16 within two roundings of T (of max |v|) of the float32 twin on the same rounded
inputs (the kernel accumulates in float32 and rounds once), and within 32 roundings of the
twin run in T (which rounds its scores, softmax and products to T). Acceptance: the greedy walk
exactly; the sampling rule exactly (the same path and bonus) given the same uniforms.
Compaction: bit-exact rows. The emulation itself: threadgroup memory, barriers and SIMD-group
operations behave as Metal defines them, and a barrier some threads skip is reported.

Each kernel compiles once per dtype (cached by source hash in the temp folder). On a Mac the
last test runs the real kernels against the twins; elsewhere it is skipped, saying so.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec.kernels import metal_emulation
from edgespec.kernels.accept import accept_greedy, accept_sampling
from edgespec.kernels.backend import KernelError
from edgespec.kernels.compact import gather_rows_kernel, gather_rows_twin
from edgespec.kernels.metal import MetalKernel
from edgespec.kernels.tree_attention import tree_attention_kernel, tree_attention_twin
from edgespec.kernels.tree_mask import tree_mask
from edgespec.tree import DraftTree, attention_mask
from edgespec.verify import verify_greedy, verify_sampling_uniforms

EMULATED, WHY = metal_emulation.available()
emulated = pytest.mark.skipif(not EMULATED, reason=f"Metal kernels not emulated here: {WHY}")
on_metal = pytest.mark.skipif(not mx.metal.is_available(),
                              reason="no Metal device: the real kernels run only on a Mac "
                                     "(their source is checked here through the emulation)")
EPS = {mx.float32: 2.0**-24, mx.float16: 2.0**-11, mx.bfloat16: 2.0**-8}


def random_tree(rng, n: int, alphabet: int = 1000) -> DraftTree:
    parents = [-1] + [int(rng.integers(max(0, i - 3), i)) if rng.random() < 0.6
                      else int(rng.integers(0, i)) for i in range(1, n)]
    return DraftTree([int(t) for t in rng.integers(0, alphabet, n)], parents)


# --- the mask --------------------------------------------------------------------------------

@pytest.mark.parametrize("window", [None, 1, 5, 30])
def test_tree_mask_expands_to_the_dense_mask(window):
    rng = np.random.default_rng(3)
    for n in (1, 2, 33, 64):
        tree = random_tree(rng, n)
        start, offset = 4, 4 + int(rng.integers(0, 40))
        dense = attention_mask(tree, np.arange(start, offset), offset, window)
        got = np.array(tree_mask(tree, n, start, offset, window).dense())
        want = dense if dense is not None else np.ones((n, offset - start + n), bool)
        assert (got == want).all()


# --- tree attention --------------------------------------------------------------------------

CASES = [  # nodes, cached keys, H, H_kv, D, window, dtype, softcap
    (1, 1, 2, 2, 8, None, mx.float32, None),  # one node, one cached key
    (5, 0, 2, 1, 16, None, mx.float32, None),  # no cached key: the tree alone
    (64, 45, 3, 1, 32, None, mx.float32, None),  # 64 nodes, GQA ratio 3
    (12, 40, 4, 4, 48, 9, mx.float32, None),  # a window whose boundary falls in cache and tree
    (7, 33, 2, 2, 80, None, mx.float32, 5.0),  # D not a multiple of 32; Gemma 2's softcap
    (17, 50, 6, 2, 64, None, mx.float16, None),
    (17, 50, 6, 2, 64, 20, mx.bfloat16, None),
    (64, 3, 3, 1, 24, 4, mx.float16, None),
]


def _inputs(rng, n, cached, h, hkv, d, dtype):
    shape_kv = (1, hkv, cached + n, d)
    q = mx.array(rng.standard_normal((1, h, n, d)).astype(np.float32) * 2)
    k = mx.array(rng.standard_normal(shape_kv).astype(np.float32))
    v = mx.array(rng.standard_normal(shape_kv).astype(np.float32))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


@emulated
@pytest.mark.parametrize("case", CASES, ids=lambda c: "n{}-L{}-H{}/{}-D{}-w{}-{}-cap{}".format(
    *c[:6], str(c[6]).split(".")[-1], c[7]))
def test_tree_attention_matches_the_twin(case):
    n, cached, h, hkv, d, window, dtype, softcap = case
    rng = np.random.default_rng(n * 100 + cached)
    tree = random_tree(rng, n)
    start = int(rng.integers(0, 5))
    mask = tree_mask(tree, n, start, start + cached, window)
    q, k, v = _inputs(rng, n, cached, h, hkv, d, dtype)
    scale = d**-0.5
    got = np.array(tree_attention_kernel(q, k, v, scale, mask, softcap, "emulate").astype(mx.float32))
    f32 = [x.astype(mx.float32) for x in (q, k, v)]
    ref = np.array(tree_attention_twin(*f32, scale, mask, softcap))
    vmax = float(np.abs(np.array(f32[2])).max())
    tol = 2e-5 * vmax if dtype == mx.float32 else 2 * EPS[dtype] * vmax
    assert np.abs(got - ref).max() <= tol
    if dtype != mx.float32:  # and against the twin run in T
        own = np.array(tree_attention_twin(q, k, v, scale, mask, softcap).astype(mx.float32))
        assert np.abs(got - own).max() <= 32 * EPS[dtype] * vmax


@emulated
def test_tree_attention_sees_exactly_the_window():
    """Keys at distance window - 1 count, at distance window not: moving v at the first hidden
    key changes nothing, at the last visible one it changes the output."""
    rng = np.random.default_rng(5)
    n, cached, window = 1, 10, 4  # the node at position 10 sees keys 7..10
    mask = tree_mask(None, n, 0, cached, window)
    q, k, v = _inputs(rng, n, cached, 1, 1, 8, mx.float32)
    base = np.array(tree_attention_kernel(q, k, v, 1.0, mask, None, "emulate"))
    for key, visible in ((6, False), (7, True)):
        v2 = np.array(v)
        v2[0, 0, key] += 100.0
        out = np.array(tree_attention_kernel(q, k, mx.array(v2), 1.0, mask, None, "emulate"))
        assert (np.abs(out - base).max() > 1e-3) == visible


@emulated
def test_tree_attention_refuses_what_it_does_not_take():
    mask = tree_mask(None, 2, 0, 3, None)
    q, k, v = _inputs(np.random.default_rng(0), 2, 3, 2, 1, 8, mx.float32)
    with pytest.raises(KernelError, match="L \\+ N"):
        tree_attention_kernel(q, k[:, :, :4], v[:, :, :4], 1.0, mask, None, "emulate")
    with pytest.raises(KernelError, match="nodes"):
        tree_attention_kernel(q[:, :, :1], k, v, 1.0, mask, None, "emulate")


# --- acceptance ------------------------------------------------------------------------------

def _walks(rng, trials: int):
    """Random trees over a small alphabet (so children often match), 1 and 64 nodes included."""
    for i in range(trials):
        n = (1, 2, 64)[i] if i < 3 else int(rng.integers(2, 65))
        yield random_tree(rng, n, alphabet=int(rng.integers(2, 5)))


@emulated
def test_greedy_acceptance_equals_verify_greedy():
    rng = np.random.default_rng(11)
    lengths = set()
    for tree in _walks(rng, 40):
        argmax = rng.integers(0, 4, len(tree))
        want = verify_greedy(tree, argmax)
        path, bonus = accept_greedy(tree.parents, tree.tokens, mx.array(argmax), "emulate")
        assert (path, bonus) == (want.path, want.tokens[-1])
        lengths.add(len(path))
    chain = DraftTree.chain(7, [7] * 63)  # every node accepted: the longest path there is
    path, bonus = accept_greedy(chain.parents, chain.tokens, mx.full((64,), 7), "emulate")
    assert path == list(range(64)) and bonus == 7
    assert len(lengths) > 3  # the walks stopped at many depths


@emulated
@pytest.mark.parametrize("with_q", [False, True])
def test_sampling_acceptance_equals_the_rule_given_the_uniforms(with_q):
    rng = np.random.default_rng(12 + with_q)
    accepted = 0
    for tree in _walks(rng, 40):
        n, V = len(tree), int(rng.choice([4, 50, 700]))
        sharp = rng.choice([0.05, 1.0])  # peaked rows: residuals that empty out, q[x] = 0
        p = rng.dirichlet(np.ones(V) * sharp, size=n).astype(np.float32)
        q = rng.dirichlet(np.ones(V) * sharp, size=n).astype(np.float32) if with_q else None
        u = rng.random(n)
        tree.q = None if q is None else q.astype(np.float64)
        want = verify_sampling_uniforms(tree, p.astype(np.float64), u)
        path, bonus = accept_sampling(tree.parents, tree.tokens, p, q, u, "emulate")
        assert (path, bonus) == (want.path, want.tokens[-1])
        accepted += len(path) - 1
    assert accepted > 0


# --- compaction ------------------------------------------------------------------------------

@emulated
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_compaction_moves_exactly_the_accepted_rows(dtype):
    rng = np.random.default_rng(13)
    keys = mx.array(rng.standard_normal((1, 3, 80, 40)).astype(np.float32)).astype(dtype)
    values = mx.array(rng.standard_normal((1, 3, 80, 24)).astype(np.float32)).astype(dtype)
    for first, path in ((0, [0]), (10, [0, 2, 5, 6]), (15, list(range(0, 64, 2)) + [64])):
        got = gather_rows_kernel(keys, values, first, path, "emulate")
        want = gather_rows_twin(keys, values, first, path)
        assert all(mx.array_equal(g, w).item() for g, w in zip(got, want))


# --- the emulation itself --------------------------------------------------------------------

PROBE = """
threadgroup float shared[64];
const uint t = thread_position_in_threadgroup.x;
shared[t] = x[thread_position_in_grid.x];
threadgroup_barrier(mem_flags::mem_threadgroup);
const float v = shared[63 - t];                     // another thread's value
out[thread_position_in_grid.x * 4 + 0] = simd_sum(v);
out[thread_position_in_grid.x * 4 + 1] = simd_shuffle_xor(v, 1u);
out[thread_position_in_grid.x * 4 + 2] = simd_prefix_exclusive_sum(v);
out[thread_position_in_grid.x * 4 + 3] = float(threadgroup_position_in_grid.x * 100 + simdgroup_index_in_threadgroup);
"""


@emulated
def test_emulation_models_groups_barriers_and_simd_groups():
    k = MetalKernel("probe", ("x",), ("out",), PROBE)
    x = np.arange(128, dtype=np.float32)
    (out,) = k("emulate", [mx.array(x)], grid=(128, 1, 1), threadgroup=(64, 1, 1),
               output_shapes=[(128, 4)], output_dtypes=[mx.float32])
    out = np.array(out)
    v = np.concatenate([x[:64][::-1], x[64:][::-1]])  # what each thread read from shared
    lanes = v.reshape(4, 32)
    assert (out[:, 0] == np.repeat(lanes.sum(1), 32)).all()
    assert (out[:, 1] == v.reshape(-1, 2)[:, ::-1].reshape(-1)).all()
    assert (out[:, 2] == (np.cumsum(lanes, 1) - lanes).reshape(-1)).all()
    assert (out[:, 3] == [g * 100 + s for g in (0, 1) for s in (0, 1) for _ in range(32)]).all()


@emulated
def test_emulation_reports_a_barrier_not_every_thread_reaches():
    body = """
if (thread_position_in_threadgroup.x == 3) { return; }
threadgroup_barrier(mem_flags::mem_threadgroup);
out[thread_position_in_grid.x] = 1.0f;
"""
    k = MetalKernel("divergent", ("x",), ("out",), body)
    with pytest.raises(KernelError, match="not reached by every thread"):
        k("emulate", [mx.zeros((32,))], grid=(32, 1, 1), threadgroup=(32, 1, 1),
          output_shapes=[(32,)], output_dtypes=[mx.float32])


# --- on a Mac: the real kernels ---------------------------------------------------------------

@on_metal
def test_real_metal_kernels_match_the_twins():
    rng = np.random.default_rng(21)
    with mx.stream(mx.gpu):
        for n, cached, h, hkv, d, window, dtype, softcap in CASES:
            tree = random_tree(rng, n)
            mask = tree_mask(tree, n, 0, cached, window)
            q, k, v = _inputs(rng, n, cached, h, hkv, d, dtype)
            got = tree_attention_kernel(q, k, v, 0.3, mask, softcap, "metal").astype(mx.float32)
            f32 = [x.astype(mx.float32) for x in (q, k, v)]
            ref = tree_attention_twin(*f32, 0.3, mask, softcap)
            tol = 2e-5 if dtype == mx.float32 else 2 * EPS[dtype]
            assert np.abs(np.array(got) - np.array(ref)).max() <= tol * float(mx.abs(f32[2]).max())
        for tree in _walks(rng, 20):
            argmax = rng.integers(0, 4, len(tree))
            want = verify_greedy(tree, argmax)
            assert accept_greedy(tree.parents, tree.tokens, mx.array(argmax), "metal") == \
                (want.path, want.tokens[-1])
            p = rng.dirichlet(np.ones(50), size=len(tree)).astype(np.float32)
            u = rng.random(len(tree))
            want = verify_sampling_uniforms(tree, p.astype(np.float64), u)
            assert accept_sampling(tree.parents, tree.tokens, p, None, u, "metal") == \
                (want.path, want.tokens[-1])
        keys = mx.array(rng.standard_normal((1, 2, 40, 16)).astype(np.float32))
        got = gather_rows_kernel(keys, keys, 5, [0, 3, 4], "metal")
        assert mx.array_equal(got[0], gather_rows_twin(keys, keys, 5, [0, 3, 4])[0]).item()


# --- the backend's choice ---------------------------------------------------------------------

def test_the_backend_chooses_and_says_why(monkeypatch):
    from edgespec.kernels.backend import metal_available, metal_kernels, metal_summary, set_metal_kernels

    set_metal_kernels(None)
    try:
        monkeypatch.setenv("EDGESPEC_METAL_KERNELS", "emulate")
        assert metal_kernels() == "emulate" and "emulated" in metal_summary()
        monkeypatch.setenv("EDGESPEC_METAL_KERNELS", "off")
        assert metal_kernels() == "off" and "EDGESPEC_METAL_KERNELS=off" in metal_summary()
        monkeypatch.setenv("EDGESPEC_METAL_KERNELS", "auto")
        assert metal_kernels() == ("metal" if metal_available() else "off")
        if not mx.metal.is_available():
            assert metal_summary().startswith("off (no Metal device")
        set_metal_kernels("emulate")  # the setter wins over the environment
        assert metal_kernels() == "emulate"
        set_metal_kernels(None)
        monkeypatch.setenv("EDGESPEC_METAL_KERNELS", "on")
        with pytest.raises(KernelError, match="'on' is not one of auto, emulate, off"):
            metal_kernels()
        with pytest.raises(KernelError, match="'fast'"):
            set_metal_kernels("fast")
    finally:
        set_metal_kernels(None)
