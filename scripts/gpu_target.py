"""The target for ``gpu_distill.py``, in PyTorch: a llama-family model read from edgespec's
converted folder (MLX's quantized layout, dequantized to float32 exactly as edgespec does), its
forward over a padded batch with or without a cache, and batched generation (greedy or top-p).
``tests/test_gpu_distill.py`` holds it to edgespec's own target on the CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


def dequantize(w: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int) -> np.ndarray:
    """MLX's affine layout -> float32: ``w`` uint32 (rows, cols*bits/32), values little end first;
    each group of cols/scales.shape[1] values is scale * q + bias (computed in float32, as
    ``mx.dequantize`` does before edgespec's float32 cast)."""
    per = 32 // bits
    shifts = np.arange(per, dtype=np.uint32) * bits
    q = (w[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    q = q.reshape(w.shape[0], -1).astype(np.float32)
    groups = scales.shape[1]
    q = q.reshape(w.shape[0], groups, -1)
    out = q * scales.astype(np.float32)[..., None] + biases.astype(np.float32)[..., None]
    return out.reshape(w.shape[0], -1)


def load_weights(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config, float32 tensors by Hugging Face name) of an edgespec-converted model folder."""
    from safetensors.numpy import load_file

    config = json.loads((folder / "config.json").read_text())
    raw = {k: v for f in sorted(folder.glob("*.safetensors"))  # one file, or shards
           for k, v in load_file(str(f)).items()}
    out = {}
    for name, value in raw.items():
        if name.endswith((".scales", ".biases")):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if base is not None and f"{base}.scales" in raw:
            q = config["quantization"]  # a layer's own entry, else the model's
            bits = (q[base] if isinstance(q.get(base), dict) else q)["bits"]
            value = dequantize(value, raw[f"{base}.scales"], raw[f"{base}.biases"], bits)
        out[name] = torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))
    return config, out


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE (mlx's traditional=False): x (B, heads, N, D), positions (B, N)."""
    D = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)
    ang = positions.float()[:, None, :, None] * inv  # (B, 1, N, D/2)
    cos, sin = ang.cos(), ang.sin()
    a, b = x[..., : D // 2].float(), x[..., D // 2 :].float()
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)


def attention(q, k, v, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q (B, Hq, N, D), k/v (B, Hkv, T, D), mask (B, N, T) bool (True: may attend). GQA by
    grouping the query heads of one key head."""
    B, Hq, N, D = q.shape
    kv = k.shape[1]
    qg = q.reshape(B, kv, Hq // kv, N, D)
    s = (qg * scale) @ k[:, :, None].transpose(-1, -2)  # (B, kv, rep, N, T)
    s = s.float().masked_fill(~mask[:, None, None], -math.inf)
    w = torch.softmax(s, dim=-1).to(v.dtype)
    return (w @ v[:, :, None]).reshape(B, Hq, N, D)


class Target:
    """A llama-family target in float32: forward over a padded batch, with or without a cache."""

    def __init__(self, config: dict, w: dict[str, torch.Tensor], device: str):
        self.c = config
        self.w = {k: v.to(device) for k, v in w.items()}
        self.embed = self.w["model.embed_tokens.weight"]
        self.head = self.w.get("lm_head.weight", self.embed)
        self.L = config["num_hidden_layers"]
        self.heads, self.kv = config["num_attention_heads"], config["num_key_value_heads"]
        self.hd = config.get("head_dim") or config["hidden_size"] // self.heads
        self.eps, self.theta = config["rms_norm_eps"], config.get("rope_theta", 10000.0)

    def forward(self, ids, positions, mask, cache=None, start: int = 0, aux=()):
        """ids/positions (B, N); mask (B, N, start+N) bool; ``cache``: [(k, v)] per layer, each
        (B, Hkv, Tmax, D), written at start..start+N. Returns (logits of the last position only
        when a cache is given, else all; hidden (B, N, H) before the final norm; aux features)."""
        B, N = ids.shape
        x = self.embed[ids]
        feats = []
        for i in range(self.L):
            if i in aux:
                feats.append(x)
            p = f"model.layers.{i}."
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], self.eps)
            q = (h @ self.w[p + "self_attn.q_proj.weight"].T).view(B, N, self.heads, self.hd)
            k = (h @ self.w[p + "self_attn.k_proj.weight"].T).view(B, N, self.kv, self.hd)
            v = (h @ self.w[p + "self_attn.v_proj.weight"].T).view(B, N, self.kv, self.hd)
            q = rope(q.transpose(1, 2), positions, self.theta)
            k = rope(k.transpose(1, 2), positions, self.theta)
            v = v.transpose(1, 2)
            if cache is not None:
                ck, cv = cache[i]
                ck[:, :, start : start + N], cv[:, :, start : start + N] = k, v
                k, v = ck[:, :, : start + N], cv[:, :, : start + N]
            o = attention(q, k, v, mask, self.hd**-0.5).transpose(1, 2).reshape(B, N, -1)
            x = x + o @ self.w[p + "self_attn.o_proj.weight"].T
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.eps)
            g = h @ self.w[p + "mlp.gate_proj.weight"].T
            x = x + (F.silu(g) * (h @ self.w[p + "mlp.up_proj.weight"].T)) @ self.w[p + "mlp.down_proj.weight"].T
        if self.L in aux:
            feats.append(x)
        last = x[:, -1:] if cache is not None else x
        logits = rms_norm(last, self.w["model.norm.weight"], self.eps) @ self.head.T
        return logits, x, feats

    def new_cache(self, B: int, T: int):
        shape = (B, self.kv, T, self.hd)
        dev = self.embed.device
        return [(torch.zeros(shape, device=dev), torch.zeros(shape, device=dev))
                for _ in range(self.L)]


# --- batched generation -------------------------------------------------------------------------


def sample_top_p(logits: torch.Tensor, temp: float, top_p: float, gen: torch.Generator) -> torch.Tensor:
    probs = torch.softmax(logits.float() / temp, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    keep = sorted_p.cumsum(-1) - sorted_p < top_p  # the smallest prefix with mass >= top_p
    sorted_p = sorted_p * keep
    pick = torch.multinomial(sorted_p / sorted_p.sum(-1, keepdim=True), 1, generator=gen)
    return order.gather(-1, pick)[:, 0]


@torch.no_grad()
def generate(target: Target, prompts: list[list[int]], max_new: int, stop: set[int], *,
             sampling: tuple[float, float] | None = None, gen=None) -> list[tuple[list[int], bool]]:
    """Each prompt's continuation (stop token excluded) and whether it stopped, B rows at once:
    left padding, one cache. Every ``COMPACT_EVERY`` steps, once most live rows have stopped,
    the stopped ones leave the batch (their cache rows too), so a few long answers do not keep
    the whole batch running."""
    dev = target.embed.device
    B, P = len(prompts), max(len(p) for p in prompts)
    pad = torch.tensor([P - len(p) for p in prompts], device=dev)
    ids = torch.zeros(B, P, dtype=torch.long, device=dev)
    for r, p in enumerate(prompts):
        ids[r, P - len(p) :] = torch.tensor(p, device=dev)
    ar = torch.arange(P + max_new, device=dev)
    valid = ar[None, :] >= pad[:, None]  # (B, T): real tokens (pad rows see only themselves)
    causal = ar[:P, None] >= ar[None, :P]
    mask = (causal[None] & valid[:, None, :P]) | torch.eye(P, dtype=torch.bool, device=dev)[None]
    positions = (ar[None, :P] - pad[:, None]).clamp(min=0)
    cache = target.new_cache(B, P + max_new)
    stop_t = torch.tensor(sorted(stop), device=dev)
    logits, _, _ = target.forward(ids, positions, mask, cache, 0)
    out = torch.zeros(B, max_new, dtype=torch.long, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    length = torch.full((B,), max_new, device=dev)
    rows = torch.arange(B, device=dev)  # the live rows' indices into out / done / length
    for t in range(max_new):
        last = logits[:, -1]
        tok = sample_top_p(last, *sampling, gen) if sampling else last.argmax(-1)
        out[rows, t] = tok
        hit = torch.isin(tok, stop_t) & ~done[rows]
        length[rows] = torch.where(hit, torch.full_like(tok, t), length[rows])
        done[rows] |= hit
        if t == max_new - 1:
            break
        if t % COMPACT_EVERY == COMPACT_EVERY - 1:
            live = ~done[rows]
            if not bool(live.any()):
                break
            if float(live.float().mean()) < 0.5:
                rows, pad, valid, tok = rows[live], pad[live], valid[live], tok[live]
                cache = [(k[live], v[live]) for k, v in cache]
        pos = (P + t - pad)[:, None]
        logits, _, _ = target.forward(tok[:, None], pos, valid[:, None, : P + t + 1], cache, P + t)
    out, length, done = out.cpu().numpy(), length.cpu().numpy(), done.cpu().numpy()
    return [(out[r, : length[r]].tolist(), bool(done[r])) for r in range(B)]


COMPACT_EVERY = 16
