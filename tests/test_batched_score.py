"""Several sequences scored in one forward (targets/batched.py, native/block.h's segments):
each sequence's logits, hidden states, captured states and cache are the bits it gets when
scored alone, whatever sequences come with it (chains and trees, different context lengths,
float and 4-bit weights); where the forward cannot be shared the parts are scored in turn."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec.targets import load_target
from edgespec.targets.batched import Part, can_share, score_many
from edgespec.tree import DraftTree

from .test_kernels import mod  # noqa: F401  (the fixture: the module, or skip / fail)
from .tiny import KINDS


def _prefilled(target, ids):
    cache = target.make_cache()
    target.score(ids[:-1], cache, head=False)
    cache.commit()
    return cache


def _parts(target, seed):
    rng = np.random.default_rng(seed)
    contexts = [3, 40, 17, 90]
    shapes = [
        [9],  # a plain step
        DraftTree([7, 8, 9, 10, 11], [-1, 0, 0, 1, 2]),  # a tree
        [5, 6, 7, 8],  # a chain
        DraftTree([3, 4, 5], [-1, 0, 0]),
    ]
    out = []
    for c, shape in zip(contexts, shapes):
        ids = [int(t) for t in rng.integers(4, 200, size=c)]
        out.append((ids, shape))
    return out


def _alone(target, spec, capture):
    res = []
    for ids, shape in spec:
        cache = _prefilled(target, ids)
        o = target.score(shape, cache, capture=capture)
        cache.commit()
        kv = [np.array(k[..., : cache.offset, :]) for k in cache.keys]
        res.append((np.array(o.logits), np.array(o.hidden),
                    {i: np.array(h) for i, h in o.captured.items()}, kv))
    return res


def _together(target, spec, capture):
    caches = [_prefilled(target, ids) for ids, _ in spec]
    parts = [Part(shape, cache, capture) for (_, shape), cache in zip(spec, caches)]
    assert can_share(target, parts)
    outs = score_many(target, parts)
    res = []
    for o, cache in zip(outs, caches):
        cache.commit()
        kv = [np.array(k[..., : cache.offset, :]) for k in cache.keys]
        res.append((np.array(o.logits), np.array(o.hidden),
                    {i: np.array(h) for i, h in o.captured.items()}, kv))
    return res


def _same(got, want):
    for (gl, gh, gc, gkv), (wl, wh, wc, wkv) in zip(got, want):
        np.testing.assert_array_equal(gl, wl)
        np.testing.assert_array_equal(gh, wh)
        assert gc.keys() == wc.keys()
        for i in gc:
            np.testing.assert_array_equal(gc[i], wc[i])
        for a, b in zip(gkv, wkv):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["llama", "bias"])
def test_rows_scored_together_get_their_alone_bits(mod, tiny_models, kind):
    target = load_target(tiny_models.path(layers=3, **KINDS[kind]), dtype="float32")
    assert target.model.native_blocks()
    capture = (0, 2, 3)
    for seed in range(3):
        spec = _parts(target, seed)
        _same(_together(target, spec, capture), _alone(target, spec, capture))
        # every pair, in either order: a row's bits do not depend on its neighbours
        for a, b in ((0, 1), (3, 2), (1, 3)):
            sub = [spec[a], spec[b]]
            _same(_together(target, sub, ()), _alone(target, sub, ()))


def test_quantized_rows_scored_together_get_their_alone_bits(mod, tiny_models, tmp_path):
    from .test_qmatmul import _quantized_copy

    target = load_target(_quantized_copy(tiny_models.path(layers=3), tmp_path / "q"), dtype="auto")
    assert target.quantized and target.model.native_blocks()
    spec = _parts(target, 5)
    _same(_together(target, spec, ()), _alone(target, spec, ()))


def test_unshared_forwards_fall_back_to_one_part_at_a_time(mod, tiny_models):
    target = load_target(tiny_models.path(layers=2, **KINDS["window"]), dtype="float32")
    spec = _parts(target, 1)
    caches = [_prefilled(target, ids) for ids, _ in spec]
    parts = [Part(shape, cache) for (_, shape), cache in zip(spec, caches)]
    big = [Part(list(range(4, 40)), target.make_cache()), Part([5], target.make_cache())]
    assert not can_share(target, big)  # more rows than the native block takes
    outs = score_many(target, parts)
    want = _alone(target, spec, ())
    for o, (wl, *_ ) in zip(outs, want):
        np.testing.assert_array_equal(np.array(o.logits), wl)
    assert mx.array(0).item() == 0
