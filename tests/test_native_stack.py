"""The decoder blocks as one native call per forward (``native.DecoderStack``, taken by
``Decoder._stack_for``) against one native call per layer (the same operations): the same
bits in the logits, the captured hidden states and the cache, for chains and trees, float and
4/8-bit weights, a sliding window, qwen3's q/k norms; the per-layer path wherever a block would not run natively
(its weights replaced, its native form set aside, a long forward); bad arguments named."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec import Engine
from edgespec.cache import KVCache
from edgespec.targets import load_target
from edgespec.targets.decoder import Decoder
from edgespec.tree import DraftTree

from .test_kernels import mod  # noqa: F401  (the fixture: the module, or skip / fail)
from .tiny import KINDS, QK_NORM

PER_LAYER = staticmethod(lambda *a: None)
IN_PLACE = KVCache.in_place_buffers  # as built, before a test wraps it


def _forwards(target, context: int = 20, capture=()):
    """Logits and captured states of a chain, a tree and one token after ``context`` tokens,
    and the cache's committed keys/values after them."""
    cache = target.make_cache()
    ids = [(5 * i + 3) % 200 + 4 for i in range(context + 12)]
    for a in range(0, context, 64):  # prefill chunks longer than a stack forward takes
        target.score(ids[a : min(a + 64, context)], cache, head=False)
        cache.commit()
    outs = []
    for tokens, keep in ((ids[context : context + 5], None),
                         (DraftTree([ids[context + 5], 9, 10, 11, 12, 13], [-1, 0, 0, 1, 1, 3]),
                          [0, 1, 3]),
                         ([7], None)):
        out = target.score(tokens, cache, capture=capture)
        outs.append(np.array(out.logits))
        outs += [np.array(out.captured[c]) for c in sorted(out.captured)]
        cache.commit(keep)
    kv = [np.array(a[..., : cache.slots(i), :]) for buffers in (cache.keys, cache.values)
          for i, a in enumerate(buffers)]
    return outs, kv


def _both_paths(target, monkeypatch, **kw):
    """_forwards through the stack (asserting it ran) and one native call per layer."""
    ran = []
    real = Decoder._run_stack
    monkeypatch.setattr(Decoder, "_run_stack", lambda self, *a: ran.append(1) or real(self, *a))
    got = _forwards(target, **kw)
    assert ran, "the stack did not run"
    monkeypatch.setattr(Decoder, "_stack_for", PER_LAYER)
    want = _forwards(target, **kw)
    monkeypatch.undo()
    return got, want


def _assert_same(got, want):
    for g, w in zip(got[0] + got[1], want[0] + want[1], strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("kind,context", [("llama", 20), ("bias", 20), ("window", 20),
                                          ("window", 340), ("qk_norm", 20)])
def test_the_stack_gives_the_per_layer_bits(mod, tiny_models, kind, context, monkeypatch):
    options = QK_NORM if kind == "qk_norm" else KINDS[kind]
    target = load_target(tiny_models.path(layers=3, **options), dtype="float32")
    _assert_same(*_both_paths(target, monkeypatch, context=context, capture=(0, 2, 3)))


@pytest.mark.parametrize("bits,symmetric", [(4, False), (8, True)])
@pytest.mark.parametrize("q8", [False, True])
def test_the_stack_gives_the_per_layer_bits_quantized(mod, tiny_models, tmp_path, bits,
                                                      symmetric, q8, monkeypatch):
    from edgespec.kernels import backend

    from .test_qmatmul import _quantized_copy

    if q8 and not mod.has_q8_activations():
        pytest.skip("no int8 activation kernels here")
    target = load_target(_quantized_copy(tiny_models.path(layers=3), tmp_path / "q", bits,
                                         symmetric), dtype="auto")
    assert target.quantized
    backend.set_q8_activations(q8)
    try:
        _assert_same(*_both_paths(target, monkeypatch, capture=(1,)))
    finally:
        backend.set_q8_activations(None)


@pytest.mark.parametrize("options", [{}, QK_NORM], ids=["llama", "qk_norm"])
def test_greedy_decoding_through_the_stack_is_the_per_layer_decoding(mod, tiny_models, options,
                                                                       monkeypatch):
    target = load_target(tiny_models.path(layers=2, **options), dtype="float32")
    chat = [{"role": "user", "content": "the cat sat on the mat"}]
    ran = []
    real = Decoder._run_stack
    monkeypatch.setattr(Decoder, "_run_stack", lambda self, *a: ran.append(1) or real(self, *a))
    got = Engine(target, pipeline=False).generate(chat, max_tokens=12).token_ids
    assert len(ran) >= len(got) - 1  # every step's forward after the prompt's
    monkeypatch.setattr(Decoder, "_stack_for", PER_LAYER)
    assert Engine(target, pipeline=False).generate(chat, max_tokens=12).token_ids == got


def test_the_stack_steps_aside_where_a_block_would(mod, tiny_models, monkeypatch):
    """A replaced weight (the fused copy is stale), a block's native form set aside, a forward
    longer than the native block takes: each runs as ``_run`` does, and the stack is taken
    again once the block is native again."""
    target = load_target(tiny_models.path(layers=2), dtype="float32")
    model, cache = target.model, target.make_cache()
    ids = [(5 * i + 3) % 200 + 4 for i in range(80)]
    ran = []
    real = Decoder._run_stack
    monkeypatch.setattr(Decoder, "_run_stack", lambda self, *a: ran.append(1) or real(self, *a))

    def stacked(tokens) -> bool:
        ran.clear()
        target.score(tokens, cache)
        return bool(ran)

    assert not stacked(ids[:70])  # 70 tokens: more than a native block takes
    cache.commit()
    assert stacked(ids[70:72])
    block = model.model.layers[1]
    saved = block._fused.native_args
    block._fused.native_args = None
    assert not stacked(ids[70:72])
    block._fused.native_args = saved
    assert stacked(ids[70:72])
    q = block.self_attn.q_proj
    q.weight = q.weight * 1.0  # the module's weight is no longer the fused copy's view
    assert not block._fused.current(block)
    assert not stacked(ids[70:72])


def test_bad_stack_arguments_name_what_is_allowed(mod, tiny_models):
    target = load_target(tiny_models.path(layers=2), dtype="float32")
    fused = [b._fused for b in target.model.model.layers]
    stack = mod.DecoderStack([f.native_args for f in fused], [f.native_shape for f in fused])
    assert len(stack) == 2
    with pytest.raises(ValueError, match="one argument list and one shape per layer"):
        mod.DecoderStack([fused[0].native_args], [f.native_shape for f in fused])
    with pytest.raises(ValueError, match=r"a shape is \(hidden, heads"):
        mod.DecoderStack([fused[0].native_args], [fused[0].native_shape[:5]])
    x = mx.zeros((1, 1, target.args.hidden_size))
    cache = target.make_cache()
    keys = [cache.write_buffers(i, 1, f.native_shape[2], f.native_shape[3])[0]
            for i, f in enumerate(fused)]
    anc, qpos = mx.ones((1, 2), dtype=mx.uint32), mx.zeros((1,), dtype=mx.int32)
    with pytest.raises(ValueError, match="for each of its 2 layers"):
        stack.forward(x, keys[:1], keys, [anc] * 2, [qpos] * 2, [0, 0], [0, 0], [0, 0], False, [])
    with pytest.raises(ValueError, match="capture takes increasing layer ids"):
        stack.forward(x, keys, keys, [anc] * 2, [qpos] * 2, [0, 0], [0, 0], [0, 0], False, [2, 1])
    out, k, v, got = stack.forward(x, keys, keys, [anc] * 2, [qpos] * 2, [0, 0], [0, 0], [0, 0],
                                   False, [0, 2])
    mx.eval(out, k, v, got)
    assert out.shape == x.shape and len(k) == len(v) == 2 and len(got) == 2


def test_the_stack_rounds_x_as_the_per_layer_path_inside_any_scope(mod, tiny_models, tmp_path,
                                                                   monkeypatch):
    """The masks are asked whether x is rounded to int8 as ``_run`` asks them (inside
    ``q8_scope(True)``, every block being native), whatever scope the caller is in."""
    from edgespec.kernels import backend

    from .test_qmatmul import _quantized_copy

    if not mod.has_q8_activations():
        pytest.skip("no int8 activation kernels here")
    target = load_target(_quantized_copy(tiny_models.path(layers=2), tmp_path / "q"), dtype="auto")
    with backend.q8_scope(False):
        _assert_same(*_both_paths(target, monkeypatch))


def test_layers_of_different_key_shapes_run_one_block_a_layer_with_the_same_bits(mod, tiny_models):
    """A stack whose layers differ in kv heads (the one-operation form needs one key/value
    shape) gives what its layers give as one-layer stacks, one after the other, by slice
    updates even when asked to write in place."""
    a = load_target(tiny_models.path(layers=1, kv_heads=2), dtype="float32")
    b = load_target(tiny_models.path(layers=1, kv_heads=1), dtype="float32")
    fused = [a.model.model.layers[0]._fused, b.model.model.layers[0]._fused]
    shapes = [f.native_shape for f in fused]
    assert shapes[0][2] != shapes[1][2]  # (hidden, heads, kv_heads, ...)
    stack = mod.DecoderStack([f.native_args for f in fused], shapes)
    rng = np.random.default_rng(3)
    x = mx.array(rng.standard_normal((1, 3, a.args.hidden_size), dtype=np.float32))
    anc = mx.array(np.array([[1, 0], [3, 0], [7, 0]], dtype=np.uint32))
    qpos = mx.array(np.arange(5, 8, dtype=np.int32))

    def buffers(shape):
        kv = mx.array(rng.standard_normal((1, shape[2], 16, shape[3]), dtype=np.float32))
        return kv, kv * 0.5

    kvs = [buffers(s) for s in shapes]
    out, keys, values, _ = stack.forward(x, [k for k, _ in kvs], [v for _, v in kvs], [anc] * 2,
                                         [qpos] * 2, [5, 5], [0, 0], [0, 0], False, [])
    # asked to write in place, such a stack still returns new buffers, after `after`
    again, k2, v2, _ = stack.forward(x, [k for k, _ in kvs], [v for _, v in kvs], [anc] * 2,
                                     [qpos] * 2, [5, 5], [0, 0], [0, 0], False, [],
                                     in_place=True, after=[x * 2])
    assert len(k2) == len(v2) == 2 and mx.array_equal(again, out).item()
    h = x
    for i, f in enumerate(fused):
        one = mod.DecoderStack([f.native_args], [shapes[i]])
        h, k1, v1, _ = one.forward(h, [kvs[i][0]], [kvs[i][1]], [anc], [qpos], [5], [0], [0],
                                   False, [])
        assert mx.array_equal(k1[0], keys[i]).item() and mx.array_equal(v1[0], values[i]).item()
    assert mx.array_equal(h, out).item()


# ---- the caches written in place ----------------------------------------------------------


def _stack_inputs(target, rows: int, slots: int, rng):
    """A stack of the target's blocks, x of ``rows`` rows and per layer a pair of random
    buffers (capacity 16) with ``slots`` committed rows, as a chain's TreeMask would give."""
    fused = [b._fused for b in target.model.model.layers]
    shapes = [f.native_shape for f in fused]
    x = mx.array(rng.standard_normal((1, rows, target.args.hidden_size), dtype=np.float32))
    anc = mx.array(np.array([[(2 << i) - 1, 0] for i in range(rows)], dtype=np.uint32))
    qpos = mx.array(np.arange(slots, slots + rows, dtype=np.int32))
    buffers = [(rng.standard_normal((1, s[2], 16, s[3]), dtype=np.float32),
                rng.standard_normal((1, s[2], 16, s[3]), dtype=np.float32)) for s in shapes]
    return fused, shapes, x, anc, qpos, buffers


def test_a_forward_in_place_writes_the_rows_the_slice_updates_write(mod, tiny_models):
    """``in_place``: the rows go into the buffers given (keys and values come back empty), with
    the bits the slice updates give, and the output is the same; the next forward may read
    them through ``after`` alone."""
    target = load_target(tiny_models.path(layers=3), dtype="float32")
    rng = np.random.default_rng(5)
    fused, shapes, x, anc, qpos, buffers = _stack_inputs(target, 3, 5, rng)
    stack = mod.DecoderStack([f.native_args for f in fused], shapes)
    args = ([anc] * 3, [qpos] * 3, [5] * 3, [0] * 3, [0] * 3, False, [1])
    k0 = [mx.array(k) for k, _ in buffers]
    v0 = [mx.array(v) for _, v in buffers]
    out, keys, values, got = stack.forward(x, k0, v0, *args)
    k1 = [mx.array(k) for k, _ in buffers]
    v1 = [mx.array(v) for _, v in buffers]
    out1, none_k, none_v, got1 = stack.forward(x, k1, v1, *args, in_place=True)
    assert none_k == [] and none_v == []
    mx.eval(out1)
    assert mx.array_equal(out, out1).item() and mx.array_equal(got[0], got1[0]).item()
    for a, b in zip(keys + values, k1 + v1):
        assert mx.array_equal(a, b).item()
    # a second forward that reads the rows through `after` only: as a functional one would
    x2 = x[:, :1] * 0.5
    args2 = ([anc[:1]] * 3, [qpos[:1] + 3] * 3, [8] * 3, [0] * 3, [0] * 3, False, [])
    want, *_ = stack.forward(x2, keys, values, *args2)
    k2 = [mx.array(k) for k, _ in buffers]
    v2 = [mx.array(v) for _, v in buffers]
    first, *_ = stack.forward(x, k2, v2, *args, in_place=True)  # not evaluated
    second, *_ = stack.forward(x2, k2, v2, *args2, in_place=True, after=[first])
    assert mx.array_equal(second, want).item()


def test_the_operation_holds_the_layers_arguments_it_reads(mod, tiny_models):
    """The stack's arguments are held by its operations, not given as their inputs: lazy ones
    are evaluated when the stack is made, and a forward built, then left with the only
    references to copies of the weights (the stack and the lists gone), still gives the bits
    of the stack over the model's own weights, in place and not."""
    target = load_target(tiny_models.path(layers=3), dtype="float32")
    rng = np.random.default_rng(9)
    fused, shapes, x, anc, qpos, buffers = _stack_inputs(target, 2, 4, rng)
    args = ([anc] * 3, [qpos] * 3, [4] * 3, [0] * 3, [0] * 3, False, [3])
    held = mod.DecoderStack([f.native_args for f in fused], shapes)
    want, want_k, want_v, want_h = held.forward(
        x, [mx.array(k) for k, _ in buffers], [mx.array(v) for _, v in buffers], *args)
    mx.eval(want, want_k, want_v, want_h)
    for in_place in (False, True):
        lazy = [[a * 1 if a.size else a for a in f.native_args] for f in fused]  # not evaluated
        stack = mod.DecoderStack(lazy, shapes)
        keys = [mx.array(k) for k, _ in buffers]
        values = [mx.array(v) for _, v in buffers]
        out, k, v, got = stack.forward(x, keys, values, *args, in_place=in_place)
        del stack, lazy
        import gc

        gc.collect()
        mx.eval(out, k, v, got)
        assert mx.array_equal(out, want).item() and mx.array_equal(got[0], want_h[0]).item()
        for a, b in zip(k + v if not in_place else keys + values, want_k + want_v):
            assert mx.array_equal(a, b).item()


def test_a_buffer_given_twice_or_sharing_memory_is_not_written_over(mod, tiny_models):
    """The same array as keys and values: the forward is functional (keys come back). Two
    views of one buffer: the second gets a buffer of its own first (counted), and the rows
    are the functional forward's."""
    target = load_target(tiny_models.path(layers=1), dtype="float32")
    rng = np.random.default_rng(6)
    fused, shapes, x, anc, qpos, buffers = _stack_inputs(target, 2, 4, rng)
    stack = mod.DecoderStack([f.native_args for f in fused], shapes)
    args = ([anc], [qpos], [4], [0], [0], False, [])
    same = mx.array(buffers[0][0])
    want, keys, values, _ = stack.forward(x, [same], [same], *args)
    twice = mx.array(buffers[0][0])
    out, k, v, _ = stack.forward(x, [twice], [twice], *args, in_place=True)
    assert len(k) == len(v) == 1 and mx.array_equal(out, want).item()
    both = mx.array(np.concatenate(buffers[0]))  # (2, kv heads, 16, D): keys, then values
    mx.eval(both)
    k, v = both[0:1], both[1:2]
    mx.eval(k, v)
    before = mod.decoder_blocks_copies()
    out, *_ = stack.forward(x, [k], [v], *args, in_place=True)
    mx.eval(out)
    assert mod.decoder_blocks_copies() == before + 1
    want, keys, values, _ = stack.forward(x, [mx.array(buffers[0][0])],
                                          [mx.array(buffers[0][1])], *args)
    assert mx.array_equal(out, want).item()
    assert mx.array_equal(k, keys[0]).item() and mx.array_equal(v, values[0]).item()


def _in_place_modes(monkeypatch) -> list[bool]:
    """The answers ``KVCache.in_place_buffers`` gives from now on (whether a stack forward may
    write in place), in order."""
    modes = []

    def spy(self):
        answer = IN_PLACE(self)
        modes.append(answer[0])
        return answer

    monkeypatch.setattr(KVCache, "in_place_buffers", spy)
    return modes


def test_a_decoding_writes_its_cache_in_place_and_readers_see_the_rows(mod, tiny_models,
                                                                        monkeypatch):
    """Every stack forward of a decoding writes the cache's own buffers in place (no copies);
    whatever reads them afterwards, built lazily or not (``keys``, a commit that moves rows, a
    fork), sees them; an array handed out, or a fork's view, keeps its rows when the cache is
    written again (it is then written by slice updates, and in place from the next forward)."""
    target = load_target(tiny_models.path(layers=2), dtype="float32")
    ids = [(7 * i + 2) % 200 + 4 for i in range(40)]
    modes = _in_place_modes(monkeypatch)

    def decode(cache):
        target.score(ids[:20], cache, head=False)
        cache.commit()
        for i in range(3):  # not evaluated between the forwards
            target.score(ids[20 + i : 21 + i], cache)
            cache.commit()
        tree = DraftTree([ids[23], 9, 10, 11], [-1, 0, 0, 1])
        logits = target.score(tree, cache).logits
        cache.commit([0, 2])  # a branch: its rows move
        return logits

    copies = mod.decoder_blocks_copies()
    cache = target.make_cache()
    got = decode(cache)
    assert all(modes) and len(modes) == 5 and mod.decoder_blocks_copies() == copies
    kv = [np.array(a[..., : cache.slots(i), :]) for buffers in (cache.keys, cache.values)
          for i, a in enumerate(buffers)]
    monkeypatch.setattr(KVCache, "in_place_buffers", lambda self: (False, IN_PLACE(self)[1]))
    other = target.make_cache()
    want = decode(other)
    assert mx.array_equal(got, want).item()
    for a, b in zip(kv, [np.array(a[..., : other.slots(i), :]) for bufs in (other.keys,
                         other.values) for i, a in enumerate(bufs)], strict=True):
        np.testing.assert_array_equal(a, b)
    # a fork views the committed rows; the cache trimmed below them writes again
    modes = _in_place_modes(monkeypatch)
    fork = cache.fork(cache.offset)
    seen = [np.array(k) for k in fork.keys if k is not None]
    cache.trim(4)
    modes.clear()
    for i in range(3):
        target.score([ids[30 + i]], cache)
        cache.commit()
    assert modes == [False, True, True]  # slice updates once, then in place again
    for k, was in zip([k for k in fork.keys if k is not None], seen):
        np.testing.assert_array_equal(np.array(k), was)


def test_a_forward_over_some_layers_leaves_the_others_lent(mod, tiny_models, monkeypatch):
    """Lent is per layer: a forward over the first layers only (a lower-layers draft) gives
    those layers new buffers, and the next full forward still writes the others by slice
    updates, so an array handed out and a fork's view keep their rows. ``keys`` is a new list:
    holding it does not expose what the cache puts in later."""
    target = load_target(tiny_models.path(layers=2), dtype="float32")
    ids = [(11 * i + 5) % 200 + 4 for i in range(30)]
    modes = _in_place_modes(monkeypatch)
    cache = target.make_cache()
    target.score(ids[:20], cache, head=False)
    cache.commit()
    held = cache.keys
    upper = held[1]
    before = np.array(upper)
    fork = cache.fork(20)
    seen = np.array(fork.keys[1])
    cache.trim(2)
    target.score([ids[20]], cache, layers=range(1), head=False)
    cache.commit()
    cache.trim(1)
    modes.clear()
    mx.eval(target.score([ids[21]], cache).logits)
    assert modes == [False]
    np.testing.assert_array_equal(np.array(upper), before)
    np.testing.assert_array_equal(np.array(fork.keys[1]), seen)
    assert held[1] is upper  # the list handed out is not the cache's own


# -- several sequences in one stack operation (Decoder.run_many, a batch's shared forward) ----


def _batch_rounds(target, capture=()):
    """Three rounds of one shared forward over three sequences (contexts of 20, 37 and 5
    tokens; chains, trees and single tokens; trees committed along a branch), through
    ``score_many``: each part's logits and captured states, then every cache's committed
    keys/values."""
    from edgespec.targets.batched import Part, can_share, score_many

    caches, ids = [], []
    for g, n in enumerate((20, 37, 5)):
        cache = target.make_cache()
        seq = [(5 * i + 3 + 7 * g) % 200 + 4 for i in range(n)]
        target.score(seq, cache, head=False)
        cache.commit()
        caches.append(cache)
        ids.append(seq)
    tree = DraftTree([11, 9, 10, 12, 13, 14], [-1, 0, 0, 1, 1, 3])
    rounds = [[([21, 22, 23, 24, 25], None), (tree, [0, 1, 3]), ([7], None)],
              [(DraftTree([5, 6, 7, 8], [-1, 0, 0, 2]), [0, 2, 3]), ([3, 4, 5], None),
               ([8, 9], [0])],
              [([7], None), ([8], None), ([9], None)]]
    outs = []
    for parts in rounds:
        batch = [Part(tokens, cache, capture) for (tokens, _), cache in zip(parts, caches)]
        assert can_share(target, batch)
        for out in score_many(target, batch):
            outs.append(np.array(out.logits))
            outs += [np.array(out.captured[c]) for c in sorted(out.captured)]
        for (_, keep), cache in zip(parts, caches):
            cache.commit(keep)
    kv = [np.array(a[..., : cache.slots(i), :]) for cache in caches
          for buffers in (cache.keys, cache.values) for i, a in enumerate(buffers)]
    return outs, kv


def _batch_both_paths(target, monkeypatch, **kw):
    """_batch_rounds through the stack's one operation (asserting every round took it) and
    through one native call per layer."""
    ran = []
    real = Decoder._run_many_stack
    monkeypatch.setattr(Decoder, "_run_many_stack",
                        lambda self, *a: ran.append(real(self, *a)) or ran[-1])
    got = _batch_rounds(target, **kw)
    assert len(ran) == 3 and all(r is not None for r in ran), "the stack did not run"
    monkeypatch.setattr(Decoder, "_run_many_stack", lambda self, *a: None)
    want = _batch_rounds(target, **kw)
    monkeypatch.undo()
    return got, want


@pytest.mark.parametrize("kind", ["llama", "bias", "window", "qk_norm"])
def test_several_sequences_in_one_stack_operation_get_the_per_layer_bits(mod, tiny_models, kind,
                                                                         monkeypatch):
    options = QK_NORM if kind == "qk_norm" else KINDS[kind]
    target = load_target(tiny_models.path(layers=3, **options), dtype="float32")
    _assert_same(*_batch_both_paths(target, monkeypatch, capture=(0, 2, 3)))


@pytest.mark.parametrize("q8", [False, True])
@pytest.mark.parametrize("options", [{}, QK_NORM], ids=["llama", "qk_norm"])
def test_several_sequences_in_one_stack_operation_quantized(mod, tiny_models, tmp_path, q8,
                                                            options, monkeypatch):
    from edgespec.kernels import backend

    from .test_qmatmul import _quantized_copy

    if q8 and not mod.has_q8_activations():
        pytest.skip("no int8 activation kernels here")
    target = load_target(_quantized_copy(tiny_models.path(layers=3, **options), tmp_path / "q",
                                         4, False), dtype="auto")
    backend.set_q8_activations(q8)
    try:
        _assert_same(*_batch_both_paths(target, monkeypatch, capture=(1,)))
    finally:
        backend.set_q8_activations(None)


def test_a_batch_with_a_lent_cache_runs_one_operation_a_layer(mod, tiny_models, monkeypatch):
    """A cache whose arrays were handed out (``keys``) cannot be written in place: the shared
    forward then runs one block operation a layer, every cache's rows as before, and the held
    array keeps its rows."""
    from edgespec.targets.batched import Part, score_many

    target = load_target(tiny_models.path(layers=2), dtype="float32")
    caches = []
    for g in range(2):
        cache = target.make_cache()
        target.score([4 + g, 9, 12, 30], cache, head=False)
        cache.commit()
        caches.append(cache)
    held = caches[1].keys[0]
    before = np.array(held[..., :4, :])
    stacked = []
    real = Decoder._run_many_stack
    monkeypatch.setattr(Decoder, "_run_many_stack",
                        lambda self, *a: stacked.append(real(self, *a)) or stacked[-1])
    outs = score_many(target, [Part([5, 6], caches[0]), Part([7], caches[1])])
    caches[0].commit()
    caches[1].commit()
    assert stacked == [None]
    alone = [target.make_cache() for _ in range(2)]
    for g, (cache, tail) in enumerate(zip(alone, ([5, 6], [7]))):
        target.score([4 + g, 9, 12, 30], cache, head=False)
        cache.commit()
        np.testing.assert_array_equal(np.array(outs[g].logits),
                                      np.array(target.score(tail, cache).logits))
    np.testing.assert_array_equal(np.array(held[..., :4, :]), before)


def test_a_batch_writes_in_place_again_after_its_caches_are_read(mod, tiny_models,
                                                                 monkeypatch):
    """Shared forwards with the caches read between them (``keys``: they are lent, take the
    per-layer path once, then own new buffers and go in place again): every row is the one a
    sequence decoded alone has."""
    from edgespec.targets.batched import Part, score_many

    stacked = []
    real = Decoder._run_many_stack

    def spy(self, *a):
        out = real(self, *a)
        stacked.append(out is not None)
        return out

    monkeypatch.setattr(Decoder, "_run_many_stack", spy)
    target = load_target(tiny_models.path(layers=2), dtype="float32")
    caches, alone = [], []
    for g in range(3):
        for into in (caches, alone):
            cache = target.make_cache()
            target.score([4 + g, 9, 12, 30 + g], cache, head=False)
            cache.commit()
            into.append(cache)
    for n, step in enumerate(([5], [6, 7], [8], [9])):
        score_many(target, [Part(step, c) for c in caches])
        for c in caches:
            c.commit()
        for c in alone:
            target.score(step, c)
            c.commit()
        if n not in (0, 3):  # the caches read after the first forward and the last only
            continue
        for c, a in zip(caches, alone):
            for i in range(2):
                np.testing.assert_array_equal(np.array(c.keys[i][..., : c.slots(i), :]),
                                              np.array(a.keys[i][..., : a.slots(i), :]))
                np.testing.assert_array_equal(np.array(c.values[i][..., : c.slots(i), :]),
                                              np.array(a.values[i][..., : a.slots(i), :]))
    assert stacked == [True, False, True, True]  # lent by the read: once per layer, then in place


def test_forward_many_declines_what_one_operation_cannot_write_in_place(mod, tiny_models):
    """forward_many answers None for layers that differ in key/value shape and for a buffer
    given twice (the caller then runs one operation a layer), and names a missing layer."""
    a = load_target(tiny_models.path(layers=1, kv_heads=2), dtype="float32")
    b = load_target(tiny_models.path(layers=1, kv_heads=1), dtype="float32")
    rng = np.random.default_rng(5)
    x = mx.array(rng.standard_normal((1, 2, a.args.hidden_size), dtype=np.float32))
    anc = mx.array(np.array([[1, 0], [1, 0]], dtype=np.uint32))
    qpos = mx.array(np.array([5, 5], dtype=np.int32))

    def buffers(shape):
        return [mx.array(rng.standard_normal((1, shape[2], 16, shape[3]), dtype=np.float32))
                for _ in range(2)]

    fused = [a.model.model.layers[0]._fused, b.model.model.layers[0]._fused]
    mixed = mod.DecoderStack([f.native_args for f in fused], [f.native_shape for f in fused])
    kv = [[buffers(f.native_shape) for f in fused] for _ in range(2)]  # [sequence][layer]
    keys = [[k for k, _ in seq] for seq in kv]
    values = [[v for _, v in seq] for seq in kv]
    assert mixed.forward_many(x, keys, values, anc, qpos, [1, 1], [[5, 5], [5, 5]], [0, 0],
                              [0, 0], False, [], []) is None
    f = fused[0]
    one = mod.DecoderStack([f.native_args], [f.native_shape])
    k0, v0 = buffers(f.native_shape)
    assert one.forward_many(x, [[k0], [k0]], [[v0], [v0]], anc, qpos, [1, 1], [[5], [5]],
                            [0, 0], [0, 0], False, [], []) is None
    k1, v1 = buffers(f.native_shape)
    with pytest.raises(ValueError, match="each of the stack's 1 layers"):
        one.forward_many(x, [[k0], [k1, k1]], [[v0], [v1]], anc, qpos, [1, 1], [[5], [5]],
                         [0, 0], [0, 0], False, [], [])


@pytest.mark.parametrize("method", ["lookup", "lookahead"])
def test_speculation_on_a_q_k_normed_model_through_the_stack_is_plain_decoding(mod, tiny_models,
                                                                               method):
    """qwen3's blocks run natively (the stack, in place): a drafter's greedy output is plain
    decoding's, token for token."""
    from edgespec import SamplingConfig, make_drafter
    from edgespec.options import spec_for

    target = load_target(tiny_models.path(layers=2, **QK_NORM), dtype="float32")
    assert target.model.native_blocks()
    chat = [{"role": "user", "content": "the cat sat on the mat and the cat sat on the"}]
    plain = Engine(target).generate(chat, max_tokens=24).token_ids
    drafter = make_drafter(spec_for(method, {}), target, SamplingConfig())
    assert Engine(target, drafter).generate(chat, max_tokens=24).token_ids == plain
