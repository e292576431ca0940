"""The decoder's forward: fused/compiled blocks agree with the module path; CPU ops agree with
MLX's own kernels; a weight replaced after fusion is not served stale."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from edgespec.targets import load_target
from edgespec.kernels.attention import attend
from edgespec.kernels.activations import logsumexp, silu
from edgespec.kernels.fused_block import COMPILE_MAX_TOKENS
from edgespec.tree import DraftTree

from .tiny import KINDS


@pytest.fixture(scope="module", params=list(KINDS))
def pair(request, tiny_models):
    """The same tiny model loaded twice (own copies): fused (as loaded) and with fusion undone."""
    path = tiny_models.path(layers=3, **KINDS[request.param])
    fused, plain = load_target(path, dtype="float32"), load_target(path, dtype="float32")
    for block in plain.model.model.layers:
        block._fused = None
    return fused, plain


def _logits(target, ids, tree: DraftTree | None = None):
    cache = target.make_cache()
    prefix = ids if tree is None else ids[:-1]
    out = target.score(prefix, cache)
    if tree is None:
        return out.logits
    cache.commit()
    return target.score(tree, cache).logits


@pytest.mark.parametrize("n", [1, 5, COMPILE_MAX_TOKENS + 16])
def test_fused_chain_matches_module_path(pair, n):
    fused, plain = pair
    assert all(b._fused is not None for b in fused.model.model.layers)
    ids = [(5 * i + 3) % 200 + 4 for i in range(n)]
    np.testing.assert_allclose(np.array(_logits(fused, ids)), np.array(_logits(plain, ids)), atol=1e-4)


def test_fused_tree_matches_module_path(pair):
    fused, plain = pair
    ids = [(7 * i + 1) % 200 + 4 for i in range(20)]
    tree = DraftTree([ids[-1], 9, 10, 11, 12, 13], [-1, 0, 0, 1, 1, 3])
    np.testing.assert_allclose(np.array(_logits(fused, ids, tree)), np.array(_logits(plain, ids, tree)),
                               atol=1e-4)


def test_compile_off_gives_the_same_logits(pair, monkeypatch):
    fused, _ = pair
    ids = [(3 * i + 2) % 200 + 4 for i in range(12)]
    compiled = np.array(_logits(fused, ids))
    monkeypatch.setenv("EDGESPEC_COMPILE", "0")
    np.testing.assert_allclose(np.array(_logits(fused, ids)), compiled, atol=1e-5)


def test_fusion_keeps_one_copy_and_notices_replaced_weights(tiny_models):
    target = load_target(tiny_models.path(), dtype="float32")  # its own copy: weights replaced
    block = target.model.model.layers[0]
    a = block.self_attn
    fused_w = block._fused.w["wqkv"]
    n = a.q_proj.weight.shape[0]
    assert mx.array_equal(fused_w[:n], a.q_proj.weight) and block._fused.current(block)
    ids = list(range(4, 14))
    before = np.array(_logits(target, ids))
    # replace a weight the usual way (load_weights): the fused copy is now stale
    new = mx.random.normal(a.q_proj.weight.shape, key=mx.random.key(1)) * 0.1
    target.model.load_weights([("model.layers.0.self_attn.q_proj.weight", new)], strict=False)
    assert not block._fused.current(block)
    after = np.array(_logits(target, ids))
    block._fused = None  # the module path with the new weight is the reference
    np.testing.assert_allclose(after, np.array(_logits(target, ids)), atol=1e-5)
    assert not np.allclose(after, before, atol=1e-3)


@pytest.mark.parametrize("n,t", [(1, 7), (4, 12), (9, 30)])
def test_cpu_attention_matches_mlx_kernel(n, t):
    rng = np.random.default_rng(n)
    q = mx.array(rng.standard_normal((1, 6, n, 16)).astype(np.float32))
    k, v = (mx.array(rng.standard_normal((1, 2, t, 16)).astype(np.float32)) for _ in range(2))
    mask = rng.random((n, t)) < 0.7
    mask[:, 0] = True  # every row sees something
    mask = mx.array(mask)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    for m in (mask, mx.where(mask, 0.0, -mx.inf)):  # boolean and additive forms
        np.testing.assert_allclose(np.array(attend(q, k, v, 0.25, m)), np.array(want), atol=1e-5)


def test_cpu_silu_matches_mlx():
    x = mx.linspace(-30, 30, 2001)
    np.testing.assert_allclose(np.array(silu(x)), np.array(nn.silu(x)), atol=1e-5, rtol=1e-5)


def test_cpu_logsumexp_matches_mlx():
    x = mx.array(np.random.default_rng(0).normal(0, 20, (3, 8192)).astype(np.float32))
    np.testing.assert_allclose(np.array(logsumexp(x)), np.array(mx.logsumexp(x, axis=-1, keepdims=True)),
                               atol=1e-4, rtol=1e-5)


@pytest.fixture(scope="module")
def quantized_pair(tiny_models, tmp_path_factory):
    """A tiny model kept 4-bit, twice: fused (as loaded) and with fusion undone."""
    from .test_qmatmul import _quantized_copy

    path = _quantized_copy(tiny_models.path(layers=3), tmp_path_factory.mktemp("q") / "m")
    fused, plain = load_target(path, dtype="auto"), load_target(path, dtype="auto")
    for block in plain.model.model.layers:
        block._fused = None
    return fused, plain


@pytest.mark.parametrize("n", [1, 5, COMPILE_MAX_TOKENS + 16])
def test_quantized_fused_chain_and_tree_match_module_path(quantized_pair, n, float_activations):
    """The module path keeps x in float32 (``backend.q8_scope``): compared with float x."""
    fused, plain = quantized_pair
    assert fused.quantized and all(b._fused is not None for b in fused.model.model.layers)
    assert type(fused.model.model.layers[0].self_attn.q_proj).__name__ == "QuantizedLinear"
    ids = [(5 * i + 3) % 200 + 4 for i in range(n)]
    np.testing.assert_allclose(np.array(_logits(fused, ids)), np.array(_logits(plain, ids)), atol=1e-4)
    tree = DraftTree([ids[-1], 9, 10, 11, 12, 13], [-1, 0, 0, 1, 1, 3])
    np.testing.assert_allclose(np.array(_logits(fused, ids + [7], tree)),
                               np.array(_logits(plain, ids + [7], tree)), atol=1e-4)
