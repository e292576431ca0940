"""The streamed weights moved into shared buffers on huge pages (``targets/weight_arena``): the
same logits to the bit before and after, float and quantized, in one buffer or one per block;
every module weight a view into its buffer, laid out in reading order; the kernel's answer to
the advice checked against /proc; off by EDGESPEC_HUGE_PAGES=0."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from edgespec.targets import load_target
from edgespec.targets import weight_arena
from edgespec.targets.weight_arena import advise_huge_pages, buffer_address, pack_blocks
from edgespec.tree import DraftTree


def _logits(target) -> list[np.ndarray]:
    cache = target.make_cache()
    ids = [(5 * i + 3) % 200 + 4 for i in range(30)]
    target.score(ids[:20], cache)
    cache.commit()
    outs = [target.score(ids[20:24], cache).logits]
    cache.commit()
    outs.append(target.score(DraftTree([ids[24], 9, 10, 11], [-1, 0, 0, 1]), cache).logits)
    cache.commit([0, 1])
    outs.append(target.score([7], cache).logits)
    return [np.array(o) for o in outs]


def _load(tiny_models, tmp_path, quantized: bool):
    path = tiny_models.path(layers=3)
    if quantized:
        from .test_qmatmul import _quantized_copy

        return load_target(_quantized_copy(path, tmp_path / "q"), dtype="auto")
    return load_target(path, dtype="float32")


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("chunk_bytes", [1, 1 << 30])  # a buffer per block / one for all
def test_packed_blocks_give_the_same_bits(tiny_models, tmp_path, quantized, chunk_bytes):
    target = _load(tiny_models, tmp_path, quantized)
    assert target.quantized == quantized
    blocks = target.model.model.layers
    before = _logits(target)
    old = [b.streamed() for b in blocks]
    buffers = pack_blocks(blocks, chunk_bytes=chunk_bytes, min_bytes=0)
    assert len(buffers) == (2 if quantized else 1) * (len(blocks) if chunk_bytes == 1 else 1)
    after = _logits(target)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    starts = {buffer_address(b) for b in buffers}
    for block, was in zip(blocks, old):
        now = block.streamed()
        assert len(now) == len(was)
        for n, w in zip(now, was):
            assert n.dtype == w.dtype and n.shape == w.shape and mx.array_equal(n, w).item()
            assert buffer_address(n) != buffer_address(w)  # moved
        assert block._fused.current(block)  # the modules hold views of the new arrays
        attn, mlp = block.self_attn, block.mlp
        wqkv, wgu = now[0], now[2 * len(now) // 4]
        assert buffer_address(attn.q_proj.weight) == buffer_address(wqkv)
        assert buffer_address(mlp.gate_proj.weight) == buffer_address(wgu)
        assert buffer_address(attn.o_proj.weight) == buffer_address(now[len(now) // 4])
        assert buffer_address(mlp.down_proj.weight) == buffer_address(now[-len(now) // 4])
    # reading order within each buffer: every array after the one before it, 64 bytes apart at most
    by_dtype = {}
    for block in blocks:
        for a in block.streamed():
            by_dtype.setdefault(a.dtype, []).append(a)
    for arrays in by_dtype.values():
        for prev, a in zip(arrays, arrays[1:]):
            gap = buffer_address(a) - (buffer_address(prev) + prev.nbytes)
            assert 0 <= gap < 64 or buffer_address(a) in starts


def test_buffer_address_of_a_view():
    a = mx.arange(1000, dtype=mx.float32)
    mx.eval(a)
    v = a[100:300].reshape(20, 10)
    mx.eval(v)
    assert buffer_address(v) == buffer_address(a) + 400
    b = mx.zeros((16,), dtype=mx.bfloat16)
    mx.eval(b)
    assert buffer_address(b[4:]) == buffer_address(b) + 8


def _huge_kb_at(address: int) -> int:
    """AnonHugePages of the mapping holding ``address`` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            inside = int(m.group(1), 16) <= address < int(m.group(2), 16)
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="transparent huge pages are Linux's")
def test_advice_is_what_the_kernel_did(monkeypatch):
    a = mx.ones((6 * weight_arena._PAGE // 4,), dtype=mx.float32)  # 6 huge pages of bytes
    mx.eval(a)
    monkeypatch.setenv("EDGESPEC_HUGE_PAGES", "0")
    assert advise_huge_pages(a) == 0
    monkeypatch.delenv("EDGESPEC_HUGE_PAGES")
    assert advise_huge_pages(mx.ones((1000,))) == 0  # smaller than a page
    assert advise_huge_pages(a.reshape(-1, 64).T) == 0  # not one run of its own bytes
    if weight_arena.thp_policy() in (None, "never"):
        assert advise_huge_pages(a) == 0
        return
    got = advise_huge_pages(a)
    if got == 0:
        pytest.skip("the kernel declined (no MADV_COLLAPSE before Linux 6.1, or no huge page free)")
    # the whole pages inside the array: 5 or 6 of them (its start is rarely on a page)
    assert got in (5 * weight_arena._PAGE, 6 * weight_arena._PAGE)
    page = weight_arena._PAGE  # the advice split the mapping where the first whole page starts
    assert _huge_kb_at(-(-buffer_address(a) // page) * page) * 1024 >= got
    assert np.array(a).sum() == a.size  # the contents are untouched


def test_a_never_policy_is_respected(monkeypatch):
    monkeypatch.setattr(weight_arena, "thp_policy", lambda: "never")
    assert not weight_arena.huge_pages_wanted()  # MADV_COLLAPSE would override the policy
    a = mx.ones((6 * weight_arena._PAGE // 4,))
    assert advise_huge_pages(a) == 0


def test_fuse_packs_and_can_run_again(tiny_models, monkeypatch):
    """``Decoder.fuse`` end to end (a tiny model's blocks are under the size it packs, so the
    threshold is lowered here): the same logits after packing, after a second fuse, and after
    one with the huge pages turned off; the count resets then."""
    from functools import partial

    from edgespec.targets import decoder

    target = load_target(tiny_models.path(layers=3), dtype="float32")
    model = target.model
    before = _logits(target)
    monkeypatch.setattr(decoder, "pack_blocks", partial(pack_blocks, min_bytes=0))
    monkeypatch.setattr(decoder, "huge_pages_wanted", lambda: True)
    q_before = buffer_address(model.model.layers[0].self_attn.q_proj.weight)
    assert model.fuse() == 3
    first = model.model.layers[0]
    assert buffer_address(first.self_attn.q_proj.weight) != q_before
    assert buffer_address(first.self_attn.o_proj.weight) == buffer_address(first.streamed()[1])
    assert model.huge_page_bytes >= 0
    for a, b in zip(before, _logits(target)):
        np.testing.assert_array_equal(a, b)
    assert model.fuse() == 3  # again, from the packed views
    for a, b in zip(before, _logits(target)):
        np.testing.assert_array_equal(a, b)
    monkeypatch.setattr(decoder, "huge_pages_wanted", lambda: False)
    model.huge_page_bytes = 123
    assert model.fuse() == 3
    assert model.huge_page_bytes == 0
    for a, b in zip(before, _logits(target)):
        np.testing.assert_array_equal(a, b)
