"""The weights a decoding step streams, on 2 MB pages (Linux).

A decoding step reads every block weight once, ~0.5 GB for the float32 demo model, from buffers
MLX allocated with ordinary 4 KB pages: ~130,000 pages a token, far more than the TLB holds, so
each needs its address translated anew (in a VM, through two sets of page tables). A one-row
product streams its weights measurably faster from 2 MB pages than from 4 KB ones (see
docs/measurements.md, "the weights on 2 MB pages"); `edgespec doctor`'s bandwidth figure is
numpy's read of its own array, which numpy already puts on 2 MB pages.

Under the ``madvise`` policy (many distributions' default) Linux gives an anonymous
buffer transparent huge pages only where it is asked to, so this module asks:

- ``pack_blocks``: a fused model's block weights (q|k|v, o, gate|up, down per block, float or
  the quantized triplets) are copied into a few large buffers, one per dtype for each group
  of consecutive blocks of at least ~128 MB, in the order a forward reads them, and each
  block is rebuilt on views of them (``FusedBlock.build(block, placed=...)``). The same bits,
  in new places: a buffer of 128 MB loses at most its two partial 2 MB pages at the ends,
  where the 120 separate buffers of the demo's blocks (1.3-7 MB each) lost most of theirs.
- ``advise_huge_pages``: ``madvise(MADV_HUGEPAGE)`` on an array's whole 2 MB pages, then
  ``MADV_COLLAPSE`` (Linux 6.1+) page by page, to move them onto huge pages now rather than
  when the kernel's background scanner gets to them (minutes for a model).

``Decoder.fuse`` does both, for the blocks and the LM head (whose arrays are each one buffer of
their own already).

The trade, measured with the float32 demo model: loading takes longer (the copy, and the kernel
finding 2 MB pages, which varies from run to run), MLX's peak memory is unchanged, and every
method decodes a few percent faster, so it is on by default (see docs/measurements.md, "the
weights on 2 MB pages").

``EDGESPEC_HUGE_PAGES=0`` turns it off; elsewhere than Linux's CPU backend, or where the
administrator set the policy to ``never``, it does nothing. The bytes the kernel put on huge
pages are ``Decoder.huge_page_bytes``, which ``edgespec doctor`` prints.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from functools import lru_cache
from pathlib import Path

import mlx.core as mx
import numpy as np

_THP = Path("/sys/kernel/mm/transparent_hugepage")


def _huge_page_size() -> int:
    try:  # 2 MB on x86-64 and on arm64 with 4 KB pages; larger with larger base pages
        return int((_THP / "hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 2 << 20


_PAGE = _huge_page_size()
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25
_CHUNK = 128 << 20  # bytes of blocks (all dtypes together) a group of buffers takes at least
# Each packed array starts a multiple of 64 bytes after its buffer's start: where it lies within
# a cache line is then what it was in a buffer of its own (MLX's start 24 bytes past a line).
_ALIGN = 64


def thp_policy() -> str | None:
    """The system's transparent huge page policy ('always', 'madvise', 'never'), or None."""
    try:
        m = re.search(r"\[(\w+)\]", (_THP / "enabled").read_text())
    except OSError:
        return None
    return m.group(1) if m else None


def huge_pages_wanted() -> bool:
    """Linux, the CPU backend (a GPU's weights are not in these pages), transparent huge pages
    not set to 'never' by the administrator (MADV_COLLAPSE would override that), and not
    turned off by EDGESPEC_HUGE_PAGES=0."""
    return (sys.platform.startswith("linux") and mx.default_device() == mx.cpu
            and os.environ.get("EDGESPEC_HUGE_PAGES", "1") != "0"
            and thp_policy() not in (None, "never"))


@lru_cache(maxsize=1)
def _madvise():
    fn = ctypes.CDLL(None, use_errno=True).madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _as_numpy(array: mx.array) -> np.ndarray:
    """A numpy view of an evaluated array's memory (bfloat16, which numpy lacks, as uint16)."""
    return np.array(array.view(mx.uint16) if array.dtype == mx.bfloat16 else array, copy=False)


def buffer_address(array: mx.array) -> int:
    """Where an evaluated array's first element lies in memory (a view's, not its buffer's)."""
    return _as_numpy(array).ctypes.data


def advise_huge_pages(array: mx.array) -> int:
    """Put the whole huge pages inside ``array``'s bytes on huge pages; returns how many bytes
    are there now (0 where this is off, the array is too small or not one contiguous run of
    bytes, or the kernel declines)."""
    if not huge_pages_wanted() or array.nbytes < _PAGE:
        return 0
    mx.eval(array)
    if not _as_numpy(array).flags.c_contiguous:
        return 0  # its bytes would not be [start, start + nbytes): others' memory lies there
    start = buffer_address(array)
    lo, hi = -(-start // _PAGE) * _PAGE, (start + array.nbytes) // _PAGE * _PAGE
    if hi <= lo:
        return 0
    madvise = _madvise()
    if madvise(lo, hi - lo, _MADV_HUGEPAGE) != 0:
        return 0  # transparent huge pages not built into this kernel
    done = 0
    for page in range(lo, hi, _PAGE):  # one page at a time: a failure elsewhere costs one page
        if madvise(page, _PAGE, _MADV_COLLAPSE) == 0:
            done += _PAGE
        elif ctypes.get_errno() == 22:  # EINVAL: no MADV_COLLAPSE before Linux 6.1; the pages
            break  # move when the kernel's background scanner reaches them
    return done


def _pack(arrays: list[mx.array]) -> tuple[list[mx.array], list[mx.array]]:
    """Copies of ``arrays`` laid out in one buffer per dtype (see ``_ALIGN``); returns (the
    copies, in order, as views; the buffers)."""
    views: list[mx.array | None] = [None] * len(arrays)
    buffers = []
    for dtype in dict.fromkeys(a.dtype for a in arrays):
        idx = [i for i, a in enumerate(arrays) if a.dtype == dtype]
        step = _ALIGN // dtype.size
        parts, offsets, at = [], [], 0
        for i in idx:
            a = arrays[i]
            offsets.append(at)
            pad = -a.size % step
            parts.append(a.reshape(-1))
            if pad:
                parts.append(mx.zeros((pad,), dtype))
            at += a.size + pad
        buffer = mx.concatenate(parts)
        for i, off in zip(idx, offsets):
            views[i] = buffer[off : off + arrays[i].size].reshape(arrays[i].shape)
        buffers.append(buffer)
    mx.eval(views, buffers)
    return views, buffers


def pack_blocks(blocks, chunk_bytes: int = _CHUNK, min_bytes: int = 2 * _PAGE) -> list[mx.array]:
    """Move the fused blocks' streamed weights (``block.streamed()``) into shared buffers of
    about ``chunk_bytes`` of consecutive blocks each, a group smaller than ``min_bytes`` left
    where it is; returns the buffers. Blocks without a fused form keep their weights. Only one
    group's old arrays are held at a time, so loading peaks at the model plus one group."""
    buffers: list[mx.array] = []
    group: list[tuple] = []  # (block, its streamed arrays), consecutive blocks
    size = 0  # the group's bytes

    def flush() -> None:
        nonlocal size
        if size >= min_bytes:
            views, own_buffers = _pack([a for _, own in group for a in own])
            at = 0
            for block, own in group:
                block.place(views[at : at + len(own)])
                at += len(own)
            buffers.extend(own_buffers)
        group.clear()
        size = 0

    for block in blocks:
        own = block.streamed()
        if own:
            group.append((block, own))
            size += sum(a.nbytes for a in own)
        if size >= chunk_bytes:
            flush()
    if group:
        flush()
    return buffers
