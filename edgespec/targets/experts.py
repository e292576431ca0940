"""Routed experts, the part every mixture-of-experts family shares (qwen3_moe, mixtral, gpt_oss,
qwen3_next / qwen3_5_moe, gemma4's MoE option).

- ``route``: a router's logits (..., E) to the top-k experts and their weights, by the family's
  scoring: ``"softmax"`` (softmax over all E, then top-k; ``norm_topk_prob`` renormalises the
  k: qwen) or ``"topk_softmax"`` (top-k logits, then a softmax over those k: mixtral, gpt_oss,
  gemma4).
- ``SwitchGLU``: E experts' gated MLPs stacked as mlx-lm's ``switch_mlp`` layout
  (``gate_proj``/``up_proj``/``down_proj`` each a ``SwitchLinear`` of weight (E, out, in), an
  optional bias (E, out)); ``nn.quantize`` turns each into a ``QuantizedSwitchLinear`` (mlx-lm's
  ``QuantizedSwitchLinear`` names: ``weight``, ``scales``, ``biases``, ``bias``).
- ``SparseMoE``: router + experts + an optional shared expert (Qwen's ``shared_expert`` scaled
  by ``sigmoid(shared_expert_gate(x))``), its submodules under the family's own weight names.
- ``MoEBlock``: the pre-norm block (x + attn(norm(x)), h + moe(norm(h))) with the MoE under the
  family's name (``mlp``; mixtral's ``block_sparse_moe``). The module path only (no fused form).
- ``stack_experts``: a checkpoint's per-expert weights (``experts.N.gate_proj.weight``, HF) or
  fused ``experts.gate_up_proj`` stacked/split into the switch layout (mlx-community checkpoints
  already ship it; both are accepted, as mlx-lm's ``sanitize`` does).

The batched path (the decision): a forward reads each chosen expert's weights once, however
many of a verify's rows chose it. On the CPU (``SwitchGLU.grouped``) the router's choices are
read on the host and each chosen expert runs one product over all its rows (the native small-M
kernels): MLX's CPU ``gather_mm`` runs one single-row product per (row, expert) pair, so its
cost grows with the pairs (measured: linear in rows, sorted or not), and takes float32 only.
Where the native kernels run, a decode step's one row takes ``grouped`` too, so that it gets
the bits a verify gives it; the price is that reading the router's choices on the host ends
plain decoding's overlap (``plain_pipeline``: the next step's graph built while this one runs)
at every MoE layer.
Elsewhere (``SwitchGLU.gathered``) the pairs are sorted by expert through ``mx.gather_mm`` /
``mx.gather_qmm`` with ``sorted_indices=True``, as mlx-lm's ``switch_layers`` does (it sorts
only from 64 pairs up). ``experts_loop`` is the naive per-row twin the tests check both against.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..errors import ModelLoadError, UnsupportedModelError
from ..kernels.activations import silu
from ..kernels.backend import native_enabled, on_cpu
from ..kernels.matmul import small_matmul
from ..kernels.qmatmul import quantized_small_matmul
from .parts import Attention, project

SCORINGS = ("softmax", "topk_softmax")
Glu = Callable[[mx.array, mx.array], mx.array]  # (gate(x), up(x)) -> hidden


def routed_layer(layer: int, num_experts: int, sparse_step: int,
                 mlp_only_layers: list[int] | None) -> bool:
    """Qwen's rule for which layers route to experts (qwen3_moe, qwen3_next): experts exist,
    the layer is not in ``mlp_only_layers``, and it is every ``sparse_step``-th layer."""
    return (num_experts > 0 and layer not in (mlp_only_layers or ())
            and (layer + 1) % sparse_step == 0)


def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up: the experts' activation in qwen, mixtral."""
    return silu(gate) * up


def swiglu_oai(gate: mx.array, up: mx.array, alpha: float = 1.702, limit: float = 7.0) -> mx.array:
    """gpt-oss's clamped SwiGLU: the gate clipped from above at ``limit``, the linear part to
    [-limit, limit] and shifted by one: (up + 1) * gate * sigmoid(alpha * gate)."""
    gate = mx.minimum(gate, limit)
    up = mx.clip(up, -limit, limit)
    return (up + 1.0) * (gate * mx.sigmoid(alpha * gate))


def route(logits: mx.array, k: int, scoring: str = "softmax",
          norm_topk_prob: bool = False) -> tuple[mx.array, mx.array]:
    """The top-``k`` experts of each row of ``logits`` (..., E) and their weights, both (..., k).

    Experts are chosen on the logits (softmax keeps their order), weighted per ``scoring``.
    """
    if scoring not in SCORINGS:
        raise UnsupportedModelError(f"expert scoring {scoring!r} is not supported; "
                                    f"supported: {', '.join(SCORINGS)}")
    inds = mx.stop_gradient(mx.argpartition(logits, kth=-k, axis=-1)[..., -k:])
    if scoring == "topk_softmax":
        return inds, mx.softmax(mx.take_along_axis(logits, inds, axis=-1), axis=-1, precise=True)
    scores = mx.take_along_axis(mx.softmax(logits, axis=-1, precise=True), inds, axis=-1)
    if norm_topk_prob:
        scores = scores / scores.sum(axis=-1, keepdims=True)
    return inds, scores


class SwitchLinear(nn.Module):
    """E linear maps stacked: weight (E, out, in), optional bias (E, out)."""

    def __init__(self, input_dims: int, output_dims: int, num_experts: int, bias: bool = False):
        super().__init__()
        scale = math.sqrt(1 / input_dims)
        self.weight = mx.random.uniform(-scale, scale, (num_experts, output_dims, input_dims))
        if bias:
            self.bias = mx.zeros((num_experts, output_dims))

    def __call__(self, x: mx.array, idx: mx.array, sorted_indices: bool = False) -> mx.array:
        """x (P, 1, in) row p through expert ``idx[p]`` -> (P, 1, out)."""
        y = mx.gather_mm(x, self["weight"].swapaxes(-1, -2), rhs_indices=idx,
                         sorted_indices=sorted_indices)
        return y + mx.expand_dims(self["bias"][idx], -2) if "bias" in self else y

    def run(self, e: int, x: mx.array) -> mx.array:
        """Expert ``e`` on rows x (M, in) -> (M, out): one product streaming its weight once
        (``kernels.matmul.small_matmul``: the native kernel where it was measured faster)."""
        y = small_matmul(x, self["weight"][e])
        return y + self["bias"][e] if "bias" in self else y

    def expert(self, e: int) -> tuple[mx.array, mx.array | None]:
        """Expert ``e``'s float weight (out, in) and bias (the naive twin's view)."""
        return self["weight"][e], self["bias"][e] if "bias" in self else None

    def to_quantized(self, group_size: int = 64, bits: int = 4, mode: str = "affine"):
        q = QuantizedSwitchLinear(self.weight, group_size, bits, mode)
        if "bias" in self:
            q.bias = self.bias
        return q


class QuantizedSwitchLinear(nn.Module):
    """``SwitchLinear`` with each expert's weight quantized (``mx.quantize`` per expert row)."""

    def __init__(self, weight: mx.array, group_size: int, bits: int, mode: str = "affine"):
        super().__init__()
        self.group_size, self.bits, self.mode = group_size, bits, mode
        self.weight, self.scales, *biases = mx.quantize(weight, group_size, bits, mode=mode)
        if biases:
            self.biases = biases[0]
        self.freeze()

    def __call__(self, x: mx.array, idx: mx.array, sorted_indices: bool = False) -> mx.array:
        y = mx.gather_qmm(x, self["weight"], self["scales"], self.get("biases"), rhs_indices=idx,
                          transpose=True, group_size=self.group_size, bits=self.bits,
                          mode=self.mode, sorted_indices=sorted_indices)
        return y + mx.expand_dims(self["bias"][idx], -2) if "bias" in self else y

    def run(self, e: int, x: mx.array) -> mx.array:
        """Expert ``e`` on rows x (M, in) -> (M, out) (``kernels.qmatmul`` for affine layers)."""
        w, s = self["weight"][e], self["scales"][e]
        b = self["biases"][e] if "biases" in self else None
        if self.mode == "affine":
            y = quantized_small_matmul(x, w, s, b, self.group_size, self.bits)
        else:
            y = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=self.group_size,
                                    bits=self.bits, mode=self.mode)
        return y + self["bias"][e] if "bias" in self else y

    def expert(self, e: int) -> tuple[mx.array, mx.array | None]:
        w = mx.dequantize(self["weight"][e], self["scales"][e],
                          self["biases"][e] if "biases" in self else None,
                          group_size=self.group_size, bits=self.bits, mode=self.mode)
        return w, self["bias"][e] if "bias" in self else None


class SwitchGLU(nn.Module):
    """E gated MLPs: down(glu(gate(x), up(x))) with each row through its chosen experts."""

    def __init__(self, dim: int, hidden: int, num_experts: int, glu: Glu = swiglu,
                 bias: bool = False):
        super().__init__()
        self.glu = glu
        self.gate_proj = SwitchLinear(dim, hidden, num_experts, bias)
        self.up_proj = SwitchLinear(dim, hidden, num_experts, bias)
        self.down_proj = SwitchLinear(hidden, dim, num_experts, bias)

    def __call__(self, x: mx.array, inds: mx.array) -> mx.array:
        """x (..., D), inds (..., k) -> (..., k, D): each row through each of its k experts,
        every chosen expert's weights read once: ``grouped`` on the CPU for several rows, for
        any row count outside float32 (which MLX's CPU ``gather_mm`` does not take) and, where
        the native kernels run, for one row too; else ``gathered`` (one row's k experts are
        distinct: each is read once either way, and no wait for the router). One row through
        ``grouped`` gets the bits it gets among a verify's rows (the native kernels' rows do
        not depend on each other; ``gather_mm``'s single-row products give other bits), so
        greedy speculation equals plain decoding on MoE models too; its cost is one wait for
        the router per MoE layer of a decode step (``tests/test_families.py``)."""
        several = inds.size > inds.shape[-1]
        if on_cpu() and (several or x.dtype != mx.float32 or native_enabled()):
            return self.grouped(x, inds)
        return self.gathered(x, inds)

    def grouped(self, x: mx.array, inds: mx.array) -> mx.array:
        """One product per chosen expert over all the rows that chose it (the choices read on
        the host: one wait for the router per layer; module docstring)."""
        k, D = inds.shape[-1], x.shape[-1]
        flat = np.array(inds.reshape(-1))
        order = np.argsort(flat, kind="stable")  # pairs grouped by expert
        experts, starts, counts = np.unique(flat[order], return_index=True, return_counts=True)
        rows, xs = order // k, x.reshape(-1, D)
        outs = []
        for e, s, c in zip(experts.tolist(), starts.tolist(), counts.tolist()):
            r = xs[mx.array(rows[s : s + c])] if len(flat) > k else xs  # one row: it is r
            h = self.glu(self.gate_proj.run(e, r), self.up_proj.run(e, r))
            outs.append(self.down_proj.run(e, h))
        y = mx.concatenate(outs) if len(outs) > 1 else outs[0]
        if not np.array_equal(order, np.arange(len(order))):
            y = y[mx.array(np.argsort(order))]  # back to (row, k) order
        return y.reshape(*inds.shape, D)

    def gathered(self, x: mx.array, inds: mx.array) -> mx.array:
        """The (row, expert) pairs sorted by expert through ``mx.gather_mm`` / ``gather_qmm``
        with ``sorted_indices`` (on Metal a segmented product: each expert read once)."""
        k, D = inds.shape[-1], x.shape[-1]
        flat = inds.flatten()
        order = mx.argsort(flat)
        rows = x.reshape(-1, 1, D)[order // k]  # (P, 1, D), P = rows * k, grouped by expert
        idx = flat[order]
        h = self.glu(self.gate_proj(rows, idx, True), self.up_proj(rows, idx, True))
        y = self.down_proj(h, idx, True)
        return y[mx.argsort(order)].reshape(*inds.shape, D)


def experts_loop(experts: SwitchGLU, x: mx.array, inds: mx.array) -> mx.array:
    """The naive twin of ``SwitchGLU.__call__``: every row, every chosen expert, one at a time
    (float weights; quantized ones dequantized)."""
    D, k = x.shape[-1], inds.shape[-1]
    xs, ids = x.reshape(-1, D), inds.reshape(-1, k).tolist()

    def lin(layer, e, v):
        w, b = layer.expert(e)
        return v @ w.T + (b if b is not None else 0)

    out = [mx.stack([lin(experts.down_proj, e, experts.glu(lin(experts.gate_proj, e, xs[r]),
                                                           lin(experts.up_proj, e, xs[r])))
                     for e in row]) for r, row in enumerate(ids)]
    return mx.stack(out).reshape(*inds.shape, D)


class SharedExpert(nn.Module):
    """Qwen's dense shared expert: down(silu(gate(x)) * up(x)), HF names."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return project(self.down_proj, silu(project(self.gate_proj, x)) * project(self.up_proj, x))


class SparseMoE(nn.Module):
    """sum_k w_k * expert_k(x) (+ sigmoid(shared_gate(x)) * shared(x)).

    ``router``/``experts``: the weight names of the router (a Linear D -> E; qwen, mixtral
    ``gate``, gpt_oss ``router``) and of the stacked experts (``switch_mlp``; gpt_oss
    ``experts``). ``shared_hidden``: the shared expert's width (None: none), under
    ``shared_expert`` and ``shared_expert_gate`` (a Linear D -> 1).
    """

    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int, *,
                 scoring: str = "softmax", norm_topk_prob: bool = False, glu: Glu = swiglu,
                 bias: bool = False, router_bias: bool = False, shared_hidden: int | None = None,
                 router: str = "gate", experts: str = "switch_mlp"):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise UnsupportedModelError(
                f"num_experts_per_tok {top_k} must be in [1, num_experts={num_experts}]")
        if scoring not in SCORINGS:
            raise UnsupportedModelError(f"expert scoring {scoring!r} is not supported; "
                                        f"supported: {', '.join(SCORINGS)}")
        self.top_k, self.scoring, self.norm_topk_prob = top_k, scoring, norm_topk_prob
        self.router_name, self.experts_name = router, experts
        setattr(self, router, nn.Linear(dim, num_experts, bias=router_bias))
        setattr(self, experts, SwitchGLU(dim, hidden, num_experts, glu, bias))
        if shared_hidden:
            self.shared_expert = SharedExpert(dim, shared_hidden)
            self.shared_expert_gate = nn.Linear(dim, 1, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        inds, scores = route(project(self[self.router_name], x), self.top_k, self.scoring,
                             self.norm_topk_prob)
        y = (self[self.experts_name](x, inds) * scores[..., None].astype(x.dtype)).sum(axis=-2)
        if "shared_expert" in self:
            y = y + mx.sigmoid(project(self.shared_expert_gate, x)) * self.shared_expert(x)
        return y


def expert_shares(model: nn.Module, tokens: int = 1) -> dict[str, float]:
    """Per stacked-experts module (its parameter path prefix, ``...switch_mlp.``), the expected
    share of its weights a forward over ``tokens`` rows reads: 1 - (1 - k/E)^tokens, k/E for
    one token (uniform routing; a real router's choices cluster, so more rows read less). A
    ``SwitchGLU``'s parent module says its k as ``top_k`` (``SparseMoE`` does); without one
    the share is 1."""
    shares = {}
    modules = dict(model.named_modules())
    for name, module in modules.items():
        if isinstance(module, SwitchGLU):
            parent = modules.get(name.rpartition(".")[0]) if "." in name else model
            E = module.gate_proj["weight"].shape[0]
            k = getattr(parent, "top_k", E)
            shares[f"{name}."] = 1.0 - (1.0 - k / E) ** tokens
    return shares


class MoEBlock(nn.Module):
    """Pre-norm block with a MoE (or any MLP) under ``ffn`` (``mlp``; mixtral's
    ``block_sparse_moe``): x + attn(norm(x)), then h + ffn(norm(h)). Module path only."""

    def __init__(self, attn: Attention, moe: nn.Module, hidden: int, eps: float, ffn: str = "mlp"):
        super().__init__()
        self.self_attn = attn
        self.ffn_name = ffn
        setattr(self, ffn, moe)
        self.input_layernorm = nn.RMSNorm(hidden, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(hidden, eps=eps)

    def __call__(self, x, positions, mask, cache, layer):
        h = x + self.self_attn(self.input_layernorm(x), positions, mask, cache, layer)
        return h + self[self.ffn_name](self.post_attention_layernorm(h))

    def fuse(self) -> bool:
        return False

    def streamed(self) -> list[mx.array]:
        return []


_PER_EXPERT = re.compile(r"^(.*)\.(\d+)\.(\w+)\.(weight|scales|biases|bias)$")


def stack_experts(weights: dict[str, mx.array], num_experts: int, src: str = "experts",
                  dst: str = "switch_mlp", names: dict[str, str] | None = None,
                  interleaved: bool = False) -> dict[str, mx.array]:
    """``weights`` with per-expert tensors ``<p>.<src>.<e>.<name>.<kind>`` stacked over e into
    ``<p>.<dst>.<names[name]>.<kind>`` (kind: weight, scales, biases, bias), and fused
    ``<p>.<src>.gate_up_proj`` (E, 2I, D) split into ``gate_proj``/``up_proj`` (halves, or
    alternating rows when ``interleaved``; HF's ``down_proj`` moved along). Already stacked
    weights pass through. ModelLoadError when an expert is missing."""
    names = names or {n: n for n in ("gate_proj", "up_proj", "down_proj")}
    out: dict[str, mx.array] = {}
    groups: dict[tuple[str, str, str], dict[int, mx.array]] = {}
    for key, w in weights.items():
        m = _PER_EXPERT.match(key)
        if m and m.group(1).endswith("." + src) and m.group(3) in names:
            group = (m.group(1)[: -len(src)], m.group(3), m.group(4))  # (prefix, name, kind)
            groups.setdefault(group, {})[int(m.group(2))] = w
        elif key.endswith(f".{src}.gate_up_proj"):
            base = key[: -len("gate_up_proj")].replace(f".{src}.", f".{dst}.")
            gate, up = (w[..., ::2, :], w[..., 1::2, :]) if interleaved else mx.split(w, 2, axis=-2)
            out[base + "gate_proj.weight"], out[base + "up_proj.weight"] = gate, up
        elif key.endswith(f".{src}.down_proj") and w.ndim == 3:
            out[key.replace(f".{src}.", f".{dst}.") + ".weight"] = w
        else:
            out[key] = w
    for (prefix, name, kind), per in groups.items():
        missing = sorted(set(range(num_experts)) - set(per))
        if missing:
            raise ModelLoadError(f"{prefix}{src}: experts {missing[:8]} have no {name}.{kind} "
                                 f"(expected {num_experts} experts)")
        out[f"{prefix}{dst}.{names[name]}.{kind}"] = mx.stack([per[e] for e in range(num_experts)])
    return out

