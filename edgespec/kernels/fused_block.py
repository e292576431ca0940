"""A decoder block fused for small inputs: one q|k|v and one gate|up matmul, and the work on
each side of attention as one compiled MLX function.

The four projections go through ``matmul.small_matmul`` (the native small-M kernel where the
backend chose it, else ``x @ w.T``), or, for blocks whose seven projections are affine
``QuantizedLinear`` layers (q/k/v alike and gate/up alike in bits, group size and biases),
through ``qmatmul.quantized_small_matmul`` on the packed weights, concatenated the same way.
Used by pre-norm SiLU blocks (``targets/parts.PreNormBlock``: llama, mistral, qwen2, qwen3,
with qwen3's per-head q/k RMSNorms) and, native only, Gemma's sandwich blocks
(``parts.SandwichBlock``). The norms and the q|k|v split with RoPE go through ``rope_norm``
(one native operation each on the CPU, where MLX's own take many); the module path is the
pure-MLX twin (tests compare the two). Forwards over at most ``COMPILE_MAX_TOKENS`` tokens run
compiled; ``EDGESPEC_COMPILE=0`` turns compilation off.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..cache import KVCache
from .activations import silu
from .attention import attend, prepare
from . import native
from .backend import SMALL_M_MAX, choice_key, on_cpu, q8_form_runs
from .matmul import small_matmul
from . import qmatmul
from .qmatmul import quantized_small_matmul, symmetric_biases
from .tree_mask import TreeMask
from .rope_norm import inverse_frequencies, qkv_rope, rms_norm, rope

_PACKED = ("weight", "scales", "biases")  # a quantized layer's arrays, in the kernel's order
STREAMED = ("wqkv", "wo", "wgu", "wd")  # a block's projections, in the order a forward reads them


# Forwards over at most this many tokens (decode steps, draft trees) run compiled; longer ones
# (prefill chunks, whose lengths vary) run the same functions uncompiled rather than trace anew.
COMPILE_MAX_TOKENS = 64


def _compile_wanted() -> bool:
    # On the CPU backend MLX builds fused kernels with the system C++ compiler (cached under
    # /tmp/mlx); where none is found it evaluates the compiled graph unfused (checked with
    # MLX 0.32.4 and no compiler on PATH), so nothing here depends on one.
    return os.environ.get("EDGESPEC_COMPILE", "1") != "0"


class FusedBlock:
    """One block's fused weights and the two functions around attention that use them.

    ``pre``: input norm, one q|k|v matmul, split, RoPE. ``post``: o_proj, residual, norm, one
    gate|up matmul, SiLU, down_proj, residual. Attention and the cache write stay outside,
    since their shapes change with the context length every step. The q/k/v and gate/up
    modules keep views into the fused arrays, so there is one copy of every weight, and
    ``current`` notices when something has replaced a module's weight since (the fused copy is
    then stale and the block falls back to the module path).
    """

    def __init__(self, block, weights: dict[str, mx.array], views: list[mx.array],
                 quant: tuple | None, halves: dict[str, tuple] | None = None):
        """``halves``: the float16 copies moved with the streamed weights (``build``'s
        ``placed``); None: made here where the native form takes them (``_half_copies``)."""
        a, r = block.self_attn, block.self_attn.rope
        self.sandwich = block.sandwich  # Gemma's block: its native form only (``build``)
        self.softcap = float(a.softcap or 0.0)  # Gemma 2's attention scores, capped
        self.w = weights
        wqkv = weights["wqkv"]  # float32 weights, or a quantized weight's float32 scales
        self.float32 = (wqkv[1] if isinstance(wqkv, tuple) else wqkv).dtype == mx.float32
        # the native forward's (packed, scales, biases) of a product whose float32 scales and
        # biases are float16 numbers, as float16 (``half_scales``); the modules keep float32
        self.halves = halves or {}
        self.views = views
        self.scale = a.scale
        self.key = (a.h, a.kv, a.d, r.dims, r.mscale, block.input_layernorm.eps, r.traditional,
                    r.base, r.scale,
                    r.freqs is not None, "bqkv" in weights, "bgu" in weights, "bd" in weights,
                    a.q_norm.eps if "nq" in weights else None, block.mlp.gate_proj.weight.shape[0],
                    quant)

        def arrays(names):
            return [a for n in names if n in weights
                    for a in (weights[n] if isinstance(weights[n], tuple) else (weights[n],))]

        self.pre_args = arrays(("n1", "wqkv", "bqkv", "nq", "nk"))
        inv_freq = inverse_frequencies(r.dims, r.base, r.freqs) if r.dims else mx.zeros((0,))
        none = mx.zeros((0,))
        mx.eval(inv_freq, none)  # now, on this thread's stream: a forward may run on another
        self.pre_args.append(inv_freq)
        # The whole block as one native operation (decode steps and verifies), float or
        # quantized weights the native kernel takes (4/8 bits, groups of 32/64/128); per-head
        # q/k norms (qwen3) with the block's own eps, their weights after the products'.
        self.native_args = None
        # (a sandwich block whose norms differ in eps has no fused form at all: ``refuses``)
        eps = block.input_layernorm.eps  # the native block's one eps for all its norms
        qk_ok = "nq" not in weights or a.q_norm.eps == a.k_norm.eps == eps
        if qk_ok and native_takes(quant):
            if halves is None and quant is not None and on_cpu():
                self.halves = _half_copies(weights, quant)

            def flat(name):
                w = self.read(name)
                return list(w) if isinstance(w, tuple) else [w]

            self.native_args = [inv_freq, weights["n1"], weights["n2"],
                                *(weights.get(n, none) for n in ("bqkv", "bgu", "bd")),
                                *(a for n in STREAMED for a in flat(n)),
                                *(weights[n] for n in ("nq", "nk", "n3", "n4") if n in weights)]
            self.native_shape = (block.input_layernorm.weight.shape[0], a.h, a.kv, a.d,
                                 block.mlp.gate_proj.weight.shape[0], r.dims, r.traditional,
                                 r.mscale, r.scale, block.input_layernorm.eps, a.scale,
                                 [[*q, int(symmetric_biases(*weights[n][1:], q[1]))]
                                  for q, n in zip(quant, STREAMED)] if quant is not None else [])
        if r.freqs is not None:
            self.pre_args.append(r.freqs)
        self.post_args = arrays(("wo", "n2", "wgu", "wd", "bgu", "bd"))

    @classmethod
    def build(cls, block, placed: list[mx.array] | None = None) -> FusedBlock | None:
        """The fused form of ``block``, or None where it has none. ``placed``: the arrays of
        an earlier build's ``streamed()``, moved (``targets/weight_arena``); the block and its
        modules then use them instead of making their own."""
        a, m = block.self_attn, block.mlp
        qkv, gu = [a.q_proj, a.k_proj, a.v_proj], [m.gate_proj, m.up_proj]
        layers = (*qkv, *gu, a.o_proj, m.down_proj)
        quant = quant_key(block)  # None unless every projection is a quantized layer it takes
        quantized = quant is not None
        if not quantized and any(type(lin) is not nn.Linear for lin in layers):
            return None  # custom, or quantized in another mode, with mixed q/k/v bits or
            # with biases on some of a joined group's layers only
        if refuses(block) or (block.sandwich and not native_takes(quant)):
            return None  # a sandwich block has no form but the native one
        if not quantized and not mx.issubdtype(a.q_proj.weight.dtype, mx.floating):
            return None
        names = _PACKED if quantized else ("weight",)
        if placed is None:
            streamed = {"wqkv": joined_weights(qkv, quantized),
                        "wo": joined_weights([a.o_proj], quantized),
                        "wgu": joined_weights(gu, quantized),
                        "wd": joined_weights([m.down_proj], quantized)}
            halves = None
        else:
            streamed, halves = _take_placed(placed, names, quantized, a.o_proj, m.down_proj)
        if block.sandwich:  # the factors Gemma's norms scale by (``norm_factors``)
            n1, n3, n2, n4, *qk = block.norm_factors()
            w = {"n1": n1, "n2": n2, "n3": n3, "n4": n4, **streamed}
        else:
            w = {"n1": block.input_layernorm.weight, "n2": block.post_attention_layernorm.weight,
                 **streamed}
        if "bias" in a.q_proj:
            w["bqkv"] = mx.concatenate([lin.bias for lin in qkv])
        if "bias" in m.gate_proj:
            w["bgu"] = mx.concatenate([lin.bias for lin in gu])
        if "bias" in m.down_proj:
            w["bd"] = m.down_proj.bias
        if a.q_norm is not None:
            w["nq"], w["nk"] = qk if block.sandwich else (a.q_norm.weight, a.k_norm.weight)
        mx.eval(w)
        views = []
        for fused, mods in ((w["wqkv"], qkv), (w["wgu"], gu)):
            fused = fused if quantized else (fused,)
            start = 0
            for lin in mods:
                n = lin.weight.shape[0]
                for name, array in zip(names, fused):
                    setattr(lin, name, array[start : start + n])
                start += n
                views.append(lin.weight)
        mx.eval([lin[n] for lin in (*qkv, *gu) for n in names])
        return cls(block, w, views, quant, halves)

    def native_ready(self) -> bool:
        """Whether small forwards of this block run as one native operation: it has the native
        form and float32 weights (or scales), so float32 activations."""
        return self.native_args is not None and self.float32

    @property
    def stack_shape(self) -> tuple:
        """``native_shape`` as ``native.DecoderStack`` takes it (a sandwich block's flag and
        attention soft-cap last)."""
        return ((*self.native_shape, True, self.softcap) if self.sandwich
                else self.native_shape)

    def native_call(self, x, mask, cache: KVCache, layer: int) -> mx.array | None:
        """The block as one native operation where this forward runs it (``__call__``'s
        test), else None: a sandwich block's way in, whose other forwards take the module
        path (it has no compiled functions)."""
        if x.shape[0] == 1 and x.dtype == mx.float32 and self.runs_native(x.shape[1], mask,
                                                                          cache, layer):
            return self._native(x, mask, cache, layer)
        return None

    def read(self, name: str):
        """Product ``name``'s weights as the native forward reads them: its float array, or
        its (packed, scales, biases), float16 ones where ``halves`` has them."""
        return self.halves.get(name, self.w[name])

    def streamed(self) -> list[mx.array]:
        """The weights a native forward streams, in the order it reads them (``read``)."""
        return [a for n in STREAMED
                for a in (self.read(n) if isinstance(self.w[n], tuple) else (self.w[n],))]

    def current(self, block) -> bool:
        # item lookups (an nn.Module is a dict of its children and arrays): this runs for every
        # block of every forward, where attribute access through nn.Module costs more
        a, m = block["self_attn"], block["mlp"]
        q, k, v, g, u = self.views
        return (a["q_proj"]["weight"] is q and a["k_proj"]["weight"] is k
                and a["v_proj"]["weight"] is v and m["gate_proj"]["weight"] is g
                and m["up_proj"]["weight"] is u)

    def runs_native(self, rows: int, mask, cache: KVCache, layer: int) -> bool:
        """Whether a forward of ``rows`` float32 rows of one sequence under ``mask`` runs as
        the one native operation (``__call__``)."""
        return (self.native_args is not None and mask_runs_native(rows, mask)
                and mask.cached == cache.slots(layer))

    def __call__(self, block, x, positions, mask, cache: KVCache, layer: int) -> mx.array:
        if x.shape[0] == 1 and x.dtype == mx.float32 and self.runs_native(x.shape[1], mask,
                                                                          cache, layer):
            return self._native(x, mask, cache, layer)
        positions, mask = prepare(positions, mask)
        compiled = x.shape[1] <= COMPILE_MAX_TOKENS and _compile_wanted()
        pre, post = _block_functions(self.key, compiled, on_cpu(), choice_key())
        q, k, v = pre(x, positions, *self.pre_args)
        k, v = cache.write(layer, k, v)
        return post(x, attend(q, k, v, self.scale, mask), *self.post_args)

    def native_many(self, x: mx.array, masks: ManyMasks, caches: list[KVCache],
                    layer: int) -> mx.array:
        """Several sequences' rows through the native block at once (``run_native_block_many``);
        callers check ``native_ready`` first."""
        q8 = bool(self.native_shape[-1]) and masks.masks[0].native_block[1]
        return run_native_block_many(self.native_args, self.native_shape, x, masks, caches,
                                     layer, q8, sandwich=self.sandwich, softcap=self.softcap)

    def _native(self, x: mx.array, mask: TreeMask, cache: KVCache, layer: int) -> mx.array:
        """The block as one native operation (``native/block.h``); it writes this forward's
        keys/values into the cache buffers itself. The module path is its pure-MLX twin."""
        q8 = bool(self.native_shape[-1]) and mask.native_block[1]
        return run_native_block(self.native_args, self.native_shape, x, mask, cache, layer, q8,
                                sandwich=self.sandwich, softcap=self.softcap)


def refuses(block) -> bool:
    """Whether ``block`` has no fused form whatever its products' widths: a pre-norm block
    whose activation or q/k norm the fused functions do not compute, or whose attention caps
    its scores, has sinks or an o_proj bias; a sandwich block (which runs only natively) whose
    norms are not ``1 + w`` ones (``norm_factors`` None), whose norms differ in eps (the native
    block takes one) or whose activation is not tanh-GELU."""
    a, m = block.self_attn, block.mlp
    if "sinks" in a or "bias" in a.o_proj:
        return True
    if not block.sandwich:
        return (m.act is not silu or a.softcap is not None
                or not (a.q_norm is None or type(a.q_norm) is nn.RMSNorm))
    norms = [*block.norms(), *((a.q_norm, a.k_norm) if a.q_norm is not None else ())]
    return (m.act is not nn.gelu_approx or block.norm_factors() is None
            or len({n.eps for n in norms}) != 1)


def mask_runs_native(rows: int, mask) -> bool:
    """What ``FusedBlock.runs_native`` asks of the forward and its mask, beside the block
    having a native form and the mask covering the layer's cached keys: asked once per
    distinct mask by ``Decoder._stack_for``."""
    return isinstance(mask, TreeMask) and mask.native_block[0] and rows <= SMALL_M_MAX


class ManyMasks:
    """The ``TreeMask``s of a forward over several sequences (one each), with what every
    layer's ``run_native_block_many`` passes on made once per forward: all rows' ancestor
    bits and positions as MLX arrays, each sequence's row count, key start and window."""

    def __init__(self, masks: Sequence[TreeMask]):
        self.masks = list(masks)
        self.anc = mx.array(np.concatenate([m.anc for m in masks]))
        self.qpos = mx.array(np.concatenate([m.qpos for m in masks]))
        self.nodes = [m.nodes for m in masks]
        self.key_starts = [m.key_start for m in masks]
        self.windows = [m.window or 0 for m in masks]


def run_native_block_many(args: list, shape: tuple, x: mx.array, masks: ManyMasks,
                          caches: list[KVCache], layer: int, q8: bool,
                          dual: bool = False, sandwich: bool = False,
                          softcap: float = 0.0) -> mx.array:
    """``run_native_block`` over several sequences' rows in one operation: ``x`` (1, N, H)
    holds each sequence's rows in turn (``masks.nodes[g]`` of them), which attend to
    ``caches[g]`` under ``masks.masks[g]``; each cache gets its own rows' keys/values. A row's
    result is the bits it gets from ``run_native_block`` over its own sequence
    (``native/block.h``). ``dual``: the EAGLE-3 head's layer (``run_native_block``'s)."""
    kv, d = shape[2:4]
    arrays, slots = [x], []
    for g, (n, cache) in enumerate(zip(masks.nodes, caches)):
        keys, values, at = cache.write_buffers(layer, n, kv, d)
        slots.append(at)
        arrays += [keys, values, masks.anc, masks.qpos, *args] if g == 0 else [keys, values]
    outs = native.load().decoder_block_many(arrays, *shape, q8, masks.nodes, slots,
                                            masks.key_starts, masks.windows, dual=dual,
                                            sandwich=sandwich, softcap=softcap)
    for g, cache in enumerate(caches):
        cache.set_buffers(layer, outs[1 + 2 * g], outs[2 + 2 * g])
    return outs[0]


def joined_weights(mods, quantized: bool):
    """The weights of ``mods`` (linear layers alike in kind) stacked along their output rows:
    one float array, or the (packed, scales, biases) triplet of quantized layers. A single
    layer's arrays are its own (no copy)."""
    names = _PACKED if quantized else ("weight",)
    parts = [mods[0][n] if len(mods) == 1 else mx.concatenate([lin[n] for lin in mods])
             for n in names]
    return tuple(parts) if quantized else parts[0]


def native_takes(quant: tuple | None) -> bool:
    """Whether the native block takes products with these (group size, bits) (None: float)."""
    return all(b in (4, 8) and g in (32, 64, 128) for g, b in (quant or ()))


def run_native_block(args: list, shape: tuple, x: mx.array, mask: TreeMask, cache: KVCache,
                     layer: int, q8: bool, dual: bool = False,
                     sandwich: bool = False, softcap: float = 0.0) -> mx.array:
    """One forward through the native decoder block (``native/block.h``) with the block's
    ``args`` (inverse frequencies, norms, biases, weights) and ``shape``: the new rows'
    keys/values go into ``cache``'s buffers of ``layer``. ``dual``: the EAGLE-3 head's layer
    (``heads/eagle3.NativeLayer``); ``sandwich``: Gemma's block, ``softcap`` its attention
    scores capped (Gemma 2's; ``native/block.h``)."""
    kv, d = shape[2:4]
    keys, values, slots = cache.write_buffers(layer, x.shape[-2], kv, d)
    anc, qpos = mask.device_arrays
    out, keys, values = native.load().decoder_block(
        [x, keys, values, anc, qpos, *args], *shape, q8, slots, mask.key_start, mask.window or 0,
        dual=dual, sandwich=sandwich, softcap=softcap)
    cache.set_buffers(layer, keys, values)
    return out


def _half_copies(weights: dict, quant: tuple) -> dict[str, tuple]:
    """The products' (packed, float16 scales, float16 biases) (``qmatmul.half_scales``) where
    the int8 form reads them (the float forms would widen them on every call), evaluated."""
    made = {n: (weights[n][0], *h) for n, q in zip(STREAMED, quant)
            if q8_form_runs(q[1]) and (h := qmatmul.half_scales(*weights[n][1:])) is not None}
    mx.eval(made)
    return made


def _take_placed(placed: list[mx.array], names: tuple, quantized: bool, o_proj,
                 down_proj) -> tuple[dict, dict]:
    """``placed`` (a ``streamed()`` list, moved) as the fused weights by name, and the
    products whose scales and biases came as float16 (``FusedBlock.halves``; the fused weights
    take float32 copies of them); o_proj and down_proj, which are not joined with others, take
    theirs as their own weights."""
    k = len(names)
    assert len(placed) == k * len(STREAMED), (len(placed), k)
    streamed = {n: tuple(placed[i * k : i * k + k]) if quantized else placed[i]
                for i, n in enumerate(STREAMED)}
    halves = {n: t for n, t in streamed.items() if quantized and t[1].dtype == mx.float16}
    for n, (packed, scales, biases) in halves.items():
        streamed[n] = (packed, scales.astype(mx.float32), biases.astype(mx.float32))
    for lin, n in ((o_proj, "wo"), (down_proj, "wd")):
        for name, array in zip(names, streamed[n] if quantized else (streamed[n],)):
            setattr(lin, name, array)
    return streamed, halves


def quantized_products(block) -> tuple[list, ...] | None:
    """The layers of the q|k|v, o, gate|up and down products of a block whose projections are
    all affine QuantizedLinear layers, each joined group alike in having biases or not (qwen2's
    q/k/v have them, added after the product as for float layers); None otherwise. Their widths
    may still differ (``quant_key``; ``qmatmul.match_widths`` makes them alike)."""
    a, m = block.self_attn, block.mlp
    groups = ([a.q_proj, a.k_proj, a.v_proj], [a.o_proj], [m.gate_proj, m.up_proj], [m.down_proj])
    for mods in groups:
        if any(type(lin) is not nn.QuantizedLinear or lin.mode != "affine"
               or "biases" not in lin for lin in mods) or len({"bias" in lin for lin in mods}) > 1:
            return None
    return groups


def quant_key(block) -> tuple | None:
    """(group size, bits) of the q|k|v, o, gate|up and down products of a block whose
    ``quantized_products`` are alike in bits and group size within each group; None otherwise
    (a float block, or one the quantized fused path does not take)."""
    groups = quantized_products(block)
    if groups is None:
        return None
    key = []
    for mods in groups:
        params = {(lin.group_size, lin.bits) for lin in mods}
        if len(params) != 1:
            return None
        key.append(params.pop())
    return tuple(key)


@lru_cache(maxsize=None)
def _block_functions(key: tuple, compiled: bool, cpu: bool, matmul_choice: tuple):
    # cpu: the silu/attention choice; matmul_choice: small_matmul's and the native ops' (made
    # while tracing)
    h, kv, d, rope_dims, mscale, eps, traditional, base, rope_scale, has_freqs, bqkv, bgu, bd, \
        qk_eps, inter, quant = key
    nq, nk = h * d, kv * d
    take = 1 if quant is None else len(_PACKED)

    def project(x, rest: list, which: int):
        """x @ w.T for the next weight in ``rest`` (float, or packed with its scales/biases)."""
        ws = [rest.pop(0) for _ in range(take)]
        if quant is None:
            return small_matmul(x, ws[0])
        return quantized_small_matmul(x, *ws, *quant[which])

    def pre(x, positions, n1, *rest):
        rest = list(rest)
        B, N, _ = x.shape
        y = project(rms_norm(x, n1, eps), rest, 0)
        if bqkv:
            y = y + rest.pop(0)
        if qk_eps is None:
            inv_freq = rest.pop(0)
            freqs = rest.pop(0) if has_freqs else None
            return qkv_rope(y, positions, inv_freq, h, kv, d, rope_dims, traditional, mscale,
                            rope_scale, base, freqs)
        q, k, v = mx.split(y, [nq, nq + nk], axis=-1)
        q, k = q.reshape(B, N, h, d), k.reshape(B, N, kv, d)
        # per head, before RoPE (qwen3)
        q, k = rms_norm(q, rest.pop(0), qk_eps), rms_norm(k, rest.pop(0), qk_eps)
        rest.pop(0)  # the inverse frequencies: the native op's
        freqs = rest.pop(0) if has_freqs else None
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
        v = v.reshape(B, N, kv, d).transpose(0, 2, 1, 3)
        kw = dict(traditional=traditional, base=base, scale=rope_scale, freqs=freqs)
        return (rope(q, positions, rope_dims, mscale, **kw),
                rope(k, positions, rope_dims, mscale, **kw), v)

    def post(x, attn, *rest):
        rest = list(rest)
        B, N, _ = x.shape
        hdn = x + project(attn.transpose(0, 2, 1, 3).reshape(B, N, -1), rest, 1)
        n2 = rest.pop(0)
        g = project(rms_norm(hdn, n2, eps), rest, 2)
        wd = [rest.pop(0) for _ in range(take)]
        if bgu:
            g = g + rest.pop(0)
        gate, up = mx.split(g, [inter], axis=-1)
        y = project(silu(gate) * up, wd, 3)
        if bd:
            y = y + rest.pop(0)
        return hdn + y

    if compiled:
        return mx.compile(pre), mx.compile(post)
    return pre, post
