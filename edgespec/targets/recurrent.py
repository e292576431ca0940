"""Recurrent layers the hybrid families share: a causal depthwise convolution over a window of
recent inputs, the gated delta rule (Qwen3-Next / Qwen3.5's linear attention), the layers built
on them (``GatedDeltaNet``, LFM2's ``ShortConv``) and the pre-norm block that holds either them
or attention under a family's weight names.

A recurrent layer runs over a forward's nodes as the cache's tree says (``HybridCache.tree``;
None: a chain): each node's convolution sees its own ancestors' inputs
(``DraftTree.window_rows``) and each node's recurrent state is its parent's, updated by the
node (nodes of one depth are updated together, as one batch). What the layer leaves in the
cache is a :class:`KeptStates`: the state every node reached, kept, so that committing an
accepted path costs nothing but picking its last node's state (copied out of its tree level's
batch). The decision: kept rather than replayed (keeping only the nodes' inputs and replaying
the accepted ones through the recurrence on commit), as the commit then runs no recurrence, at
the price of holding a verify's N states until its commit (see measurements, recurrent
rollback: ``scripts/recurrent_rollback.py`` measures both). Only a draft's forward keeps every
node's state (``HybridCache.per_node``: the forward's tokens came as a DraftTree); a forward of
tokens committed whole (a prefill chunk, a drafter's feed) keeps its last node's only.

Math follows mlx-lm's ``gated_delta.py`` (its ops path): q and k L2-normalised with the
``Dk ** -0.5`` readout scale folded into q, the decay ``g = exp(-exp(A_log) softplus(a +
dt_bias))``, ``beta = sigmoid(b)``, and the state kept in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..kernels.activations import silu
from .parts import project


def causal_conv(window: mx.array | None, rows: mx.array, weight: mx.array,
                bias: mx.array | None, tree) -> tuple[mx.array, mx.array, np.ndarray | None]:
    """Depthwise convolution of width K (``weight`` (C, K, 1), mlx's Conv1d layout) over the
    forward's ``rows`` (N, C) after the committed ``window`` (K-1, C; None: zeros).

    Returns the outputs (N, C), the buffer ``[window; rows]`` and, for a tree, each node's
    rows of it (``DraftTree.window_rows``; None for a chain, whose node u reads rows u..u+K-1).
    """
    K, (N, C) = weight.shape[1], rows.shape
    w = weight[:, :, 0].T  # (K, C)
    if window is None:
        window = mx.zeros((K - 1, C), dtype=rows.dtype)
    buf = mx.concatenate([window, rows])
    if tree is None:
        out = mx.conv1d(buf[None], weight, groups=C)[0]  # mlx-lm's op: the same sums
        idx = None
    else:
        idx = tree.window_rows(K)
        out = (buf[mx.array(idx)] * w).sum(axis=1)
    return (out if bias is None else out + bias), buf, idx


def window_after(buf: mx.array, idx: np.ndarray | None, k: int, u: int) -> mx.array:
    """The K-1 inputs the convolution keeps after node ``u`` (its window for u's children)."""
    if idx is None:
        return buf[u + 1 : u + k]
    return buf[mx.array(idx[u, 1:])]


@mx.compile
def delta_step(q, k, v, g, beta, state):
    """One gated delta update of B states: q, k (B, H, Dk), v (B, H, Dv), g, beta (B, H),
    state (B, H, Dv, Dk) -> (y (B, H, Dv), new state)."""
    state = state * g[..., None, None]
    kv = (state * k[..., None, :]).sum(axis=-1)
    delta = (v - kv) * beta[..., None]
    state = state + k[..., None, :] * delta[..., None]
    return (state * q[..., None, :]).sum(axis=-1).astype(q.dtype), state


def gated_delta(q, k, v, g, beta, state0: mx.array, tree,
                per_node: bool = True) -> tuple[mx.array, dict[int, mx.array]]:
    """The gated delta rule over a forward's nodes (q, k (N, H, Dk), v (N, H, Dv), g, beta
    (N, H)) from the committed ``state0`` (1, H, Dv, Dk): each node from its parent's state.

    Returns y (N, H, Dv) and the nodes' states {u: (1, H, Dv, Dk)} (all of them with
    ``per_node``, else a chain's last one only: a tree needs its nodes' states anyway).
    """
    N = q.shape[0]
    states: dict[int, mx.array] = {}
    if tree is None:  # a chain: one node per step
        ys, s = [], state0
        for u in range(N):
            y, s = delta_step(q[u : u + 1], k[u : u + 1], v[u : u + 1], g[u : u + 1],
                              beta[u : u + 1], s)
            ys.append(y)
            if per_node or u == N - 1:
                states[u] = s
        return mx.concatenate(ys), states
    depths, parents = tree.depths(), tree.parents
    ys, order = [], []
    for d in range(int(depths.max()) + 1):
        level = [int(u) for u in np.flatnonzero(depths == d)]
        prev = mx.concatenate([state0 if parents[u] < 0 else states[parents[u]] for u in level])
        at = mx.array(level)
        y, s = delta_step(q[at], k[at], v[at], g[at], beta[at], prev)
        ys.append(y)
        order += level
        for j, u in enumerate(level):
            states[u] = s[j : j + 1]
    inverse = np.argsort(np.array(order))
    return mx.concatenate(ys)[mx.array(inverse)], states


@dataclass
class KeptStates:
    """A forward's scratch in a recurrent slot: its convolution buffer and every node's state.
    ``after(u)`` is the slot's state once u's path is committed: (window,) or (window, state)."""

    buf: mx.array
    idx: np.ndarray | None
    k: int
    states: dict[int, mx.array] | None = None

    def after(self, u: int) -> tuple:
        # contiguous: a view would keep the whole buffer (a prefill chunk's rows, a tree
        # level's states) alive as long as the cache keeps this state
        window = mx.contiguous(window_after(self.buf, self.idx, self.k, u))
        if self.states is None:
            return (window,)
        assert u in self.states, (f"node {u}'s state was not kept: score a DraftTree, not a "
                                  "list of tokens, to commit part of a forward")
        return (window, mx.contiguous(self.states[u]))


def keep_states(buf, idx, k, states, replay_inputs) -> KeptStates:
    """The scratch a ``GatedDeltaNet`` forward leaves (``replay_inputs``: (q, k, v, g, beta,
    state0, tree), what a replaying scratch would keep instead of ``states``)."""
    return KeptStates(buf, idx, k, states)


class GatedRMSNorm(nn.Module):
    """rms_norm(x) * silu(gate), computed in float32 (Qwen3-Next's RMSNormGated)."""

    def __init__(self, dims: int, eps: float):
        super().__init__()
        self.weight = mx.ones((dims,))
        self.eps = eps

    def __call__(self, x: mx.array, gate: mx.array) -> mx.array:
        h = mx.fast.rms_norm(x, self.weight, self.eps)
        return (silu(gate.astype(mx.float32)) * h.astype(mx.float32)).astype(x.dtype)


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet linear attention: projections -> causal conv + SiLU over q|k|v -> the
    gated delta rule -> gated RMSNorm by z -> out_proj.

    ``fused``: Qwen3-Next's projections (``in_proj_qkvz``, ``in_proj_ba``, grouped per key
    head); otherwise Qwen3.5's (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``).
    """

    def __init__(self, hidden: int, k_heads: int, v_heads: int, k_dim: int, v_dim: int,
                 conv_kernel: int, eps: float, fused: bool):
        super().__init__()
        if v_heads % k_heads:
            raise ValueError(f"linear_num_value_heads {v_heads} must be a multiple of "
                             f"linear_num_key_heads {k_heads}")
        self.hk, self.hv, self.dk, self.dv, self.fused = k_heads, v_heads, k_dim, v_dim, fused
        key, value = k_heads * k_dim, v_heads * v_dim
        self.conv_dim = 2 * key + value
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv_kernel, groups=self.conv_dim,
                                bias=False)
        if fused:
            self.in_proj_qkvz = nn.Linear(hidden, 2 * key + 2 * value, bias=False)
            self.in_proj_ba = nn.Linear(hidden, 2 * v_heads, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(hidden, 2 * key + value, bias=False)
            self.in_proj_z = nn.Linear(hidden, value, bias=False)
            self.in_proj_b = nn.Linear(hidden, v_heads, bias=False)
            self.in_proj_a = nn.Linear(hidden, v_heads, bias=False)
        self.dt_bias = mx.ones((v_heads,))
        self.A_log = mx.zeros((v_heads,))
        self.norm = GatedRMSNorm(v_dim, eps)
        self.out_proj = nn.Linear(value, hidden, bias=False)

    def _project(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array, mx.array]:
        """x (N, D) -> q|k|v (N, conv_dim), z (N, Hv, Dv), b, a (N, Hv)."""
        N = x.shape[0]
        if not self.fused:
            return (project(self.in_proj_qkv, x),
                    project(self.in_proj_z, x).reshape(N, self.hv, self.dv),
                    project(self.in_proj_b, x), project(self.in_proj_a, x))
        r = self.hv // self.hk  # value heads per key head
        qkvz = project(self.in_proj_qkvz, x).reshape(N, self.hk, -1)
        ba = project(self.in_proj_ba, x).reshape(N, self.hk, -1)
        q, k, v, z = mx.split(qkvz, [self.dk, 2 * self.dk, 2 * self.dk + r * self.dv], axis=-1)
        b, a = mx.split(ba, [r], axis=-1)
        qkv = mx.concatenate([q.reshape(N, -1), k.reshape(N, -1), v.reshape(N, -1)], axis=-1)
        return qkv, z.reshape(N, self.hv, self.dv), b.reshape(N, -1), a.reshape(N, -1)

    def __call__(self, x, positions, mask, cache, slot: int) -> mx.array:
        N, tree = x.shape[1], cache.tree
        qkv, z, b, a = self._project(x[0])
        window, state0 = cache.committed(slot) or (None, None)
        conv, buf, idx = causal_conv(window, qkv, self.conv1d.weight, None, tree)
        q, k, v = mx.split(silu(conv), [self.hk * self.dk, 2 * self.hk * self.dk], axis=-1)
        q, k = _normalize_qk(q.reshape(N, self.hk, self.dk), k.reshape(N, self.hk, self.dk))
        if self.hv > self.hk:
            q, k = (mx.repeat(t, self.hv // self.hk, axis=1) for t in (q, k))
        v = v.reshape(N, self.hv, self.dv)
        g = mx.exp(-mx.exp(self.A_log.astype(mx.float32)) * nn.softplus(a + self.dt_bias))
        beta = mx.sigmoid(b)
        if state0 is None:
            state0 = mx.zeros((1, self.hv, self.dv, self.dk), dtype=mx.float32)
        y, states = gated_delta(q, k, v, g, beta, state0, tree, cache.per_node)
        cache.write_state(slot, keep_states(buf, idx, self.conv1d.weight.shape[1], states,
                                            (q, k, v, g, beta, state0, tree)))
        out = self.norm(y, z).reshape(1, N, -1)
        return project(self.out_proj, out)


def _normalize_qk(q: mx.array, k: mx.array, eps: float = 1e-6) -> tuple[mx.array, mx.array]:
    """L2-normalised q and k, q also scaled by Dk ** -0.5 (mlx-lm's ``normalize_qk``)."""
    inv = q.shape[-1] ** -0.5
    eps = eps * inv**2  # mx.fast.rms_norm adds eps to mean(x^2), the reference to sum(x^2)
    return (inv**2) * mx.fast.rms_norm(q, None, eps), inv * mx.fast.rms_norm(k, None, eps)


class ShortConv(nn.Module):
    """LFM2's gated short convolution: B, C, x = in_proj(x); out_proj(C * conv(B * x))."""

    def __init__(self, hidden: int, kernel: int, bias: bool):
        super().__init__()
        self.conv = nn.Conv1d(hidden, hidden, kernel, groups=hidden, bias=bias)
        self.in_proj = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.out_proj = nn.Linear(hidden, hidden, bias=bias)

    def __call__(self, x, positions, mask, cache, slot: int) -> mx.array:
        B, C, h = mx.split(project(self.in_proj, x[0]), 3, axis=-1)
        (window,) = cache.committed(slot) or (None,)
        out, buf, idx = causal_conv(window, B * h, self.conv.weight, self.conv.get("bias"),
                                    cache.tree)
        cache.write_state(slot, KeptStates(buf, idx, self.conv.weight.shape[1]))
        return project(self.out_proj, (C * out)[None])


class MixerBlock(nn.Module):
    """x + mixer(norm(x)), then h + ffn(norm(h)): the pre-norm block of the hybrid families,
    whose mixer is attention or a recurrent layer (both called (x, positions, mask, cache,
    slot)), each part under the checkpoint's own name. The module path only (no fused form)."""

    def __init__(self, mixer: tuple[str, nn.Module], ffn: tuple[str, nn.Module],
                 norms: tuple[str, str], hidden: int, eps: float):
        super().__init__()
        self.names = "|".join((mixer[0], ffn[0], *norms))
        setattr(self, mixer[0], mixer[1])
        setattr(self, ffn[0], ffn[1])
        for name in norms:
            setattr(self, name, nn.RMSNorm(hidden, eps=eps))

    def __call__(self, x, positions, mask, cache, slot):
        mixer, ffn, norm1, norm2 = self.names.split("|")
        h = x + self[mixer](self[norm1](x), positions, mask, cache, slot)
        return h + self[ffn](self[norm2](h))

    def fuse(self) -> bool:
        return False

    def streamed(self) -> list[mx.array]:
        return []
