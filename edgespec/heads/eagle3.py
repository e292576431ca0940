"""The EAGLE-3 head: one decoder layer over (the target's fused features, the next token's
embedding), predicting the target's token after next over a reduced draft vocabulary.

Shapes: H the target's hidden size, A = len(aux_layers), V the target's vocabulary, Vd the draft
vocabulary. The math (the EAGLE-3 reference convention, as vLLM and SpecForge run it):

    h   = fc(features)                                  (N, A*H) -> (N, H)   (step 0 only)
    x   = cat(input_layernorm(emb), hidden_norm(h))     (N, 2H)
    r   = h + o_proj(attention(q/k/v_proj(x)))          q/k/v: 2H -> the target's head geometry
    out = r + mlp(post_attention_layernorm(r))          (N, H): fed back as the next depth's h
    logits = lm_head(norm(out))                         (N, Vd); target id = d + d2t[d]

**Positions.** The pair at position t is (h_t, emb(x_{t+1})) and predicts x_{t+2}; its RoPE
position is t. A depth-j node at position p takes its parent's ``out`` as h and the embedding of
its parent's drafted token; it sees the true (step-0) entries at positions <= p-j and its drafted
ancestors. ``step`` runs any such set of rows against the head's own :class:`KVCache` (nothing
committed: the drafter commits true pairs only, and scores a depth's drafted rows beside the
earlier depths' under one ``TreeMask``); ``unroll`` is the training-time test:
the same rows for whole training sequences, all depths, in one differentiable pass per depth.
A test checks that the two give the same row.

``step`` (inference only: no gradient flows through it) runs the norms, the q|k|v split with
RoPE and every product through ``kernels`` (the native ops on the CPU: ``rope_norm``,
``matmul.linear``), where MLX's CPU ops would cost more than the arithmetic; ``unroll`` keeps the
differentiable module ops. Same math: they agree to float32 rounding. Given a ``TreeMask``
where the backend runs whole blocks natively (``kernels.backend.use_native_block``), ``step``
runs the layer as ONE native operation (``native/block.h`` with ``dual``: the embedding and
hidden halves normed apart, the residual on the hidden half), float or 4/8-bit weights; the
ops path above is its pure-MLX twin (tests compare them). A draft step's few rows cost the
layer's weight bytes and one operation, not the ~30 MLX operations around them.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from ..cache import KVCache
from ..kernels.activations import silu
from ..kernels.attention import attend, prepare
from ..kernels.backend import SMALL_M_MAX
from ..kernels.fused_block import (ManyMasks, joined_weights, native_takes, quant_key,
                                   run_native_block, run_native_block_many)
from ..kernels.matmul import linear
from ..kernels.rope_norm import inverse_frequencies, qkv_rope, rms_norm
from ..kernels.tree_mask import TreeMask
from ..targets.parts import Attention, GatedMLP, Rope
from .config import HeadConfig, vocab_index


class Eagle3Layer(nn.Module):
    """The head's decoder layer; weight names are the published checkpoints' (``formats.py``)."""

    def __init__(self, c: HeadConfig):
        super().__init__()
        H, hd = c.hidden_size, c.head_dim
        rope = Rope.from_config(hd, c.rope_theta, c.rope_scaling)
        self.self_attn = Attention(2 * H, c.num_attention_heads, c.num_key_value_heads, hd, rope,
                                   hd**-0.5)
        self.self_attn.o_proj = nn.Linear(c.num_attention_heads * hd, H, bias=False)
        self.mlp = GatedMLP(H, c.intermediate_size, silu)
        self.input_layernorm = nn.RMSNorm(H, eps=c.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(H, eps=c.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(H, eps=c.rms_norm_eps)

    def qkv(self, emb: mx.array, h: mx.array, positions) -> tuple[mx.array, mx.array, mx.array]:
        """q (B, Hq, N, D), k and v (B, Hkv, N, D) of rows (B, N, H), RoPE applied at
        ``positions`` (an int32 scalar: a chain starting there, or one per row)."""
        a = self.self_attn
        x = mx.concatenate([self.input_layernorm(emb), self.hidden_norm(h)], axis=-1)
        B, N, _ = x.shape
        q = a.q_proj(x).reshape(B, N, a.h, a.d).transpose(0, 2, 1, 3)
        k = a.k_proj(x).reshape(B, N, a.kv, a.d).transpose(0, 2, 1, 3)
        v = a.v_proj(x).reshape(B, N, a.kv, a.d).transpose(0, 2, 1, 3)
        return a.rope(q, positions), a.rope(k, positions), v

    def finish(self, h: mx.array, attn: mx.array) -> mx.array:
        """The rest of the layer after attention (B, Hq, N, D): o_proj, residual on h, MLP."""
        B, _, N, _ = attn.shape
        r = h + self.self_attn.o_proj(attn.transpose(0, 2, 1, 3).reshape(B, N, -1))
        return r + self.mlp(self.post_attention_layernorm(r))

    # -- the same two halves for inference (``Eagle3Head.step``): the kernels' ops

    def qkv_fast(self, emb: mx.array, h: mx.array, positions: mx.array):
        a, r = self.self_attn, self.self_attn.rope
        n1, n2 = self.input_layernorm, self.hidden_norm
        x = mx.concatenate([rms_norm(emb, n1.weight, n1.eps), rms_norm(h, n2.weight, n2.eps)],
                           axis=-1)
        y = mx.concatenate([linear(a.q_proj, x), linear(a.k_proj, x), linear(a.v_proj, x)], axis=-1)
        if getattr(self, "_inv_freq", None) is None:
            self._inv_freq = inverse_frequencies(r.dims, r.base, r.freqs) if r.dims else mx.zeros((0,))
            mx.eval(self._inv_freq)
        return qkv_rope(y, positions, self._inv_freq, a.h, a.kv, a.d, r.dims, r.traditional,
                        r.mscale, r.scale, r.base, r.freqs)

    def finish_fast(self, h: mx.array, attn: mx.array) -> mx.array:
        B, _, N, _ = attn.shape
        r = h + linear(self.self_attn.o_proj, attn.transpose(0, 2, 1, 3).reshape(B, N, -1))
        m, n = self.mlp, self.post_attention_layernorm
        x = rms_norm(r, n.weight, n.eps)
        return r + linear(m.down_proj, silu(linear(m.gate_proj, x)) * linear(m.up_proj, x))


class Eagle3Head(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        c = config
        self.config = c
        self.fc = nn.Linear(c.num_features * c.hidden_size, c.hidden_size, bias=False)
        self.layer = Eagle3Layer(c)
        self.norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.set_draft_vocab(np.arange(c.draft_vocab_size))

    # -- the draft vocabulary (underscored: not parameters, so never trained or saved as such)

    def set_draft_vocab(self, target_ids) -> None:
        """Draft id i stands for target id ``target_ids[i]`` (Vd distinct ids)."""
        c = self.config
        ids, index = vocab_index(target_ids, c.draft_vocab_size, c.vocab_size)
        self._ids = mx.array(ids.astype(np.int32))
        self._ids_host = ids.astype(np.int64)  # the same on the host, for drafting's top-k
        self._index = mx.array(index)

    @property
    def d2t(self) -> mx.array:
        """(Vd,) offsets, SpecForge/vLLM convention: target id = draft id + d2t[draft id]."""
        return self._ids - mx.arange(self.config.draft_vocab_size, dtype=mx.int32)

    @property
    def t2d(self) -> mx.array:
        """(V,) bool: which target ids the draft vocabulary has."""
        return self._index >= 0

    def to_target_ids(self, draft_ids):
        """Target ids of draft ids (mx or numpy, any shape)."""
        if isinstance(draft_ids, mx.array):
            return self._ids[draft_ids]
        return self._ids_host[np.asarray(draft_ids)]

    def to_draft_ids(self, target_ids: mx.array) -> mx.array:
        """Draft ids of target ids, -1 for those outside the draft vocabulary."""
        return self._index[target_ids]

    def draft_logits_to_target(self, logits: mx.array) -> mx.array:
        """(N, Vd) draft logits -> (N, V), -inf at target ids outside the draft vocabulary."""
        out = mx.full((logits.shape[0], self.config.vocab_size), -math.inf, dtype=logits.dtype)
        out[:, self._ids] = logits
        return out

    # -- drafting

    def make_cache(self) -> KVCache:
        """A cache for the head's one layer (slot 0)."""
        return KVCache(1)

    def fuse(self, features: mx.array) -> mx.array:
        """(..., A*H) target features -> (..., H)."""
        return self.fc(features)

    def fuse_rows(self, features: mx.array) -> mx.array:
        """``fuse`` for drafting (no gradient): through the kernels' products, which also take
        a quantized ``fc`` at any row count (MLX's CPU quantized product costs M one-row ones)."""
        return linear(self.fc, features)

    def logits(self, out: mx.array) -> mx.array:
        """Draft logits of ``step``'s outputs, through the kernels' ops (inference only; ``unroll``
        applies ``norm`` and ``lm_head`` as modules)."""
        return linear(self.lm_head, rms_norm(out, self.norm.weight, self.norm.eps))

    def step(self, emb: mx.array, h: mx.array, positions, mask, cache: KVCache,
             layer_slot: int = 0, last: int | None = None) -> tuple[mx.array, mx.array]:
        """Run N rows (emb (N, H), h (N, H)) against ``cache``: their keys/values go to the
        scratch slots of ``layer_slot`` after the committed ones (nothing is committed).

        ``positions``: int (a chain starting there) or (N,) ints; ``mask``: (N, committed + N)
        bool or additive, a ``TreeMask`` (its positions are the rows'; ``positions`` is then
        not read), or None (every row sees everything). Returns (logits (N, Vd), or of the
        ``last`` rows only, out (N, H)): ``out`` is the pre-norm hidden state a child row takes
        as its h.
        """
        n = emb.shape[0]
        cache.reserve(n)
        native = self._native_layer(mask, cache, layer_slot, n)
        if native is not None:
            out = native(mx.concatenate([emb, h], axis=-1), mask, cache, layer_slot)
        else:
            if isinstance(mask, TreeMask):
                positions = mask.qpos
            positions, mask = prepare(positions, mask)
            q, k, v = self.layer.qkv_fast(emb[None], h[None], positions)
            k, v = cache.write(layer_slot, k, v)
            attn = attend(q, k, v, self.layer.self_attn.scale, mask)
            out = self.layer.finish_fast(h[None], attn)[0]
        return self.logits(out if last is None else out[n - last :]), out

    def _native_layer(self, mask, cache: KVCache, slot: int, n: int) -> NativeLayer | None:
        """The layer as one native operation for this forward, or None (no TreeMask, too many
        rows, the backend does not run native blocks, or weights it does not take)."""
        if not (isinstance(mask, TreeMask) and n <= SMALL_M_MAX
                and mask.cached == cache.slots(slot) and mask.native_block[0]):
            return None
        made = getattr(self, "_native", None)
        if made is None or not made.current(self.layer):
            made = self._native = NativeLayer(self.layer)
        return made if made.args is not None else None

    # -- training

    def unroll(self, features: mx.array, emb_next: mx.array, depth: int) -> list[mx.array]:
        """The training-time test over whole sequences: logits (B, T, Vd) for depths 0..depth-1.

        ``features`` (B, T, A*H): the target's features at positions 0..T-1; ``emb_next``
        (B, T, H): row p = emb(x_{p+1}). Depth j's row p (meaningful for p >= j) is the draft
        row at position p, depth j: h = depth j-1's out at p-1, emb(x_{p+1}); it attends to the
        depth-0 keys at positions <= p-j and to depth i's key at position p-j+i, i = 1..j.
        Differentiable; one pass per depth.
        """
        a = self.layer.self_attn
        B, T, _ = emb_next.shape
        h = self.fuse(features)
        keys, values, out_logits = [], [], []
        for j in range(depth):
            if j:  # row p takes depth j-1's output at p-1
                h = mx.concatenate([mx.zeros_like(h[:, :1]), h[:, :-1]], axis=1)
            q, k, v = self.layer.qkv(emb_next, h, mx.array(0, dtype=mx.int32))
            keys.append(k)
            values.append(v)
            attn = _ttt_attention(q, keys, values, a.scale)
            h = self.layer.finish(h, attn)
            out_logits.append(self.lm_head(self.norm(h)))
        return out_logits


class NativeLayer:
    """The head's layer as the native decoder block's arguments (``dual``): n1 = both input
    norms' weights side by side, q|k|v and gate|up joined (copies: the modules keep their own
    for training and the twin), float32 or, as the target's blocks, MLX's affine 4/8-bit
    packing throughout (``kernels.fused_block``'s rules). ``args`` is None where the op does
    not take the layer (other layers, dtypes, bits or group sizes, biases on any projection,
    float or quantized, or float and quantized projections mixed); ``current`` tells when the
    modules' weights were replaced since."""

    def __init__(self, layer: Eagle3Layer):
        a, m, r = layer.self_attn, layer.mlp, layer.self_attn.rope
        self.source = _projection_weights(layer)
        self.args = None
        quant = quant_key(layer)
        projections = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj,
                       m.down_proj)
        if any("bias" in lin for lin in projections):
            return  # the op's bias slots are left empty here
        if quant is None and any(type(lin) is not nn.Linear for lin in projections):
            return
        if not native_takes(quant):
            return
        quantized = quant is not None
        weights = []
        for mods in ([a.q_proj, a.k_proj, a.v_proj], [a.o_proj], [m.gate_proj, m.up_proj],
                     [m.down_proj]):
            joined = joined_weights(mods, quantized)
            weights += list(joined) if quantized else [joined]
        norms = [layer.input_layernorm.weight, layer.hidden_norm.weight,
                 layer.post_attention_layernorm.weight]
        if any(w.dtype not in (mx.float32, mx.uint32) for w in norms + weights):
            return
        inv_freq = inverse_frequencies(r.dims, r.base, r.freqs) if r.dims else mx.zeros((0,))
        none = mx.zeros((0,))
        self.args = [inv_freq, mx.concatenate(norms[:2]), norms[2], none, none, none, *weights]
        mx.eval(self.args)
        self.shape = (norms[2].shape[0], a.h, a.kv, a.d, m.gate_proj.weight.shape[0], r.dims,
                      r.traditional, r.mscale, r.scale, layer.input_layernorm.eps, a.scale,
                      [list(q) for q in quant] if quantized else [])

    def current(self, layer: Eagle3Layer) -> bool:
        return all(x is y for x, y in zip(_projection_weights(layer), self.source))

    def __call__(self, x: mx.array, mask: TreeMask, cache: KVCache, slot: int) -> mx.array:
        """x (N, 2H) = embedding | hidden state; writes the N rows' keys/values to ``cache``'s
        scratch slots of ``slot``; returns out (N, H)."""
        return run_native_block(self.args, self.shape, x, mask, cache, slot, False, dual=True)

    def many(self, x: mx.array, masks: ManyMasks, caches: list[KVCache], slot: int) -> mx.array:
        """Several drafters' rows in turn (x (N, 2H), ``masks.nodes[g]`` rows each), each
        attending to ``caches[g]`` under its own mask; returns out (N, H)."""
        return run_native_block_many(self.args, self.shape, x, masks, caches, slot, False,
                                     dual=True)


def _projection_weights(layer: Eagle3Layer) -> list[mx.array]:
    a, m = layer.self_attn, layer.mlp
    return [lin.weight for lin in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj,
                                   m.up_proj, m.down_proj)]


QUANT_GROUP = 32


def quantized_head(head: Eagle3Head, bits: int) -> Eagle3Head:
    """A copy of ``head`` for drafting whose linear maps (fc, q/k/v/o, the MLP, the LM head) are
    affine group-quantized to ``bits`` (groups of ``QUANT_GROUP``; a map whose input width is
    not a multiple of that stays float). ``step`` and ``fuse_rows`` run them through the native
    quantized products. Its drafts differ a little from the float head's (draft quality only:
    verification keeps the output lossless). Not for training."""
    q = Eagle3Head(head.config)
    q.load_weights(list(tree_flatten(head.parameters())))
    q.set_draft_vocab(np.array(head._ids))
    nn.quantize(q, group_size=QUANT_GROUP, bits=bits,
                class_predicate=lambda _, m: isinstance(m, nn.Linear)
                and m.weight.shape[1] % QUANT_GROUP == 0)
    mx.eval(q.parameters())
    return q


def _shift(x: mx.array, s: int) -> mx.array:
    """Rows moved s places later along axis 2 (zeros in front): row p holds x's row p-s."""
    if s == 0:
        return x
    pad = mx.zeros(x.shape[:2] + (s,) + x.shape[3:], dtype=x.dtype)
    return mx.concatenate([pad, x[:, :, :-s]], axis=2)


def _ttt_attention(q: mx.array, keys: list[mx.array], values: list[mx.array],
                   scale: float) -> mx.array:
    """Depth j = len(keys)-1: query p sees depth-0 keys at positions <= p-j and depth i's key at
    position p-j+i. q (B, Hq, T, D); keys/values[i] (B, Hkv, T, D). Returns (B, Hq, T, D)."""
    j = len(keys) - 1
    B, Hq, T, D = q.shape
    kv = keys[0].shape[1]
    qg = (q * scale).reshape(B, kv, Hq // kv, T, D)
    scores = [qg @ keys[0][:, :, None].swapaxes(-1, -2)]  # (B, kv, rep, T, T)
    p = np.arange(T)
    visible = p[None, :] <= p[:, None] - j
    masks = [np.where(visible, 0.0, -np.inf)]
    for i in range(1, j + 1):
        ks = _shift(keys[i], j - i)[:, :, None]  # row p: depth i's key at p-j+i
        scores.append((qg * ks).sum(axis=-1, keepdims=True))
        masks.append(np.where(p >= j - i, 0.0, -np.inf)[:, None])
    mask = mx.array(np.concatenate(masks, axis=1).astype(np.float32))
    w = mx.softmax(mx.concatenate(scores, axis=-1) + mask, axis=-1)
    out = w[..., :T] @ values[0][:, :, None]
    for i in range(1, j + 1):
        out = out + w[..., T + i - 1 : T + i] * _shift(values[i], j - i)[:, :, None]
    return out.reshape(B, Hq, T, D)


def depth_mask(n_context: int, ancestors: np.ndarray) -> np.ndarray:
    """The mask of one drafting depth: N query rows against the head's cache holding
    ``n_context`` true entries then the drafted ones, then the N rows themselves.

    ``ancestors`` (N, n_drafted) bool: which drafted entries each row descends from. Every row
    sees all true entries, its ancestors and itself. Returns (N, n_context + n_drafted + N).
    """
    n = ancestors.shape[0]
    return np.concatenate([np.ones((n, n_context), dtype=bool), ancestors.astype(bool),
                           np.eye(n, dtype=bool)], axis=1)


def eagle3_loss(head: Eagle3Head, batch: dict, depth: int = 7,
                decay: float = 0.8) -> tuple[mx.array, list[mx.array]]:
    """The training loss: sum over depths j of decay**j x the mean cross-entropy of depth j's
    rows, and per depth the top-1 agreement with the target (a label outside the draft
    vocabulary counts as a miss there and is left out of the loss).

    ``batch``: ``features`` (B, T, A*H), ``emb_next`` (B, T, H) (row p = emb(x_{p+1})),
    ``labels`` (B, T) target ids (row p: the target's argmax at position p+1), ``mask`` (B, T)
    (rows that train). Depth j uses rows p >= j of the mask. With ``soft_ids`` / ``soft_p``
    (B, T, K): the target's K most probable tokens at p+1 and their probabilities, the loss is
    the cross-entropy against that distribution restricted to the draft vocabulary and
    renormalised, rather than against the argmax alone (EAGLE-3's reference trains on the
    target's distribution over the draft vocabulary; here its top K).
    """
    logits = head.unroll(batch["features"], batch["emb_next"], depth)
    labels = batch["labels"]
    draft = head.to_draft_ids(labels)
    rows = batch["mask"].astype(mx.float32)
    T = labels.shape[1]
    soft = "soft_ids" in batch
    if soft:  # the target's top-K distribution over the draft vocabulary, renormalised
        sd = head.to_draft_ids(mx.maximum(batch["soft_ids"], 0))
        p = batch["soft_p"] * ((batch["soft_ids"] >= 0) & (sd >= 0))
        mass = p.sum(axis=-1)
        p = p / mx.maximum(mass, 1e-9)[..., None]
    loss, top1 = mx.array(0.0), []
    for j, lg in enumerate(logits):
        valid = rows * (mx.arange(T) >= j)
        if soft:
            trains = valid * (mass > 0)
            logq = lg - mx.logsumexp(lg, axis=-1, keepdims=True)
            ce = -(p * mx.take_along_axis(logq, mx.maximum(sd, 0), axis=-1)).sum(axis=-1)
        else:
            trains = valid * (draft >= 0)
            ce = nn.losses.cross_entropy(lg, mx.maximum(draft, 0), reduction="none")
        loss = loss + decay**j * (ce * trains).sum() / mx.maximum(trains.sum(), 1.0)
        hit = head.to_target_ids(mx.stop_gradient(lg).argmax(axis=-1)) == labels
        top1.append((hit * valid).sum() / mx.maximum(valid.sum(), 1.0))
    return loss, top1
