"""`edgespec train eagle3`'s recipe at GPU scale, in PyTorch: many more Magpie questions, the
target's greedy answers, teacher-forced features and the EAGLE-3 head with its training-time test.

Why: on the 2-core CPU the recipe makes ~150 k answer tokens an hour, and the head's learning
curve (docs/architecture.md, stop 26) says it is bound by data (+0.04 held-out top-1 a doubling;
tau 3 wants ~10 M answer tokens, a day or more there). A lent CUDA machine makes millions in
minutes. MLX is not on that machine, so this is the same recipe written again in PyTorch;
``scripts/gpu_bundle.py`` makes its input here and turns its output into an edgespec head, which
is then measured here on the CPU like any other head.

The same recipe as ``edgespec train`` (``training/answers.py``, ``features.py``, ``heads/eagle3.py``):
- questions: the chat template up to the user's text plus one of the ``OPENERS``, sampled at
  temperature 1, top-p 0.95, at most 96 tokens; kept when the model ended its turn, the text has
  12+ characters, is new, and ``EvalExclusion`` (``training/exclusion.py``, loaded from this
  checkout by path) finds no overlap with an evaluation prompt;
- answers: greedy, at most 256 tokens, stopped at the end of turn; all in float32 (TF32 off), so
  they are the float32 target's own continuations up to the order of float additions;
- features: the hidden states entering the aux layers, float16; labels the target's argmax;
- the head: ``Eagle3Head``'s math (checked against it: ``tests/test_gpu_distill.py``), hard labels
  over the draft vocabulary (the most frequent training labels), depth losses weighted 0.8^j,
  AdamW, warm-up + cosine, clipping; matrix products in bfloat16 autocast.

Input (``--bundle``): ``model/`` (edgespec's converted target: config.json, model.safetensors in
MLX's quantized layout, tokenizer.json), ``recipe.json`` (template pieces, stop ids, openers,
aux layers), ``eval/`` (the evaluation prompts). Output (``--out``): ``head_layer.safetensors``,
``head_lm.safetensors`` (float16; rewritten after every epoch, so a killed run keeps the last),
``answers_K.npz`` (the answer ids), ``questions.jsonl.gz``, ``report.json``.
Phases run against one deadline (``--minutes``); each reports its throughput.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

# --- the target -----------------------------------------------------------------------------


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
    raw = load_file(str(folder / "model.safetensors"))
    out = {}
    for name, value in raw.items():
        if name.endswith((".scales", ".biases")):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if base is not None and f"{base}.scales" in raw:
            q = config["quantization"]
            bits = q.get(base, q)["bits"] if isinstance(q.get(base), dict) else q["bits"]
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


def load_exclusion(repo: Path, eval_dir: Path):
    """edgespec's own ``EvalExclusion`` (pure Python), loaded by path: no MLX needed here."""
    spec = importlib.util.spec_from_file_location("edgespec_exclusion",
                                                  repo / "edgespec/training/exclusion.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    ex = module.EvalExclusion.from_dir(eval_dir)
    if not len(ex):
        raise SystemExit(f"no evaluation prompts found in {eval_dir}: refusing to make data "
                         "without the exclusion")
    return ex


def write_questions(target, tok, recipe, exclusion, count, batch, seed, deadline, log, seen=()):
    """Magpie questions (see the module docstring) until ``count`` or the deadline; none equal
    to one in ``seen`` (an earlier run's)."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=target.embed.device).manual_seed(seed)
    prefix, openers = recipe["user_turn_prefix_ids"], recipe["openers"]
    stop = set(recipe["stop_ids"])
    seen, kept, counts = set(seen), [], {"dropped_eval": 0, "dropped_other": 0}
    t0, tokens = time.time(), 0
    while len(kept) < count and time.time() < deadline:
        starts = [openers[k] for k in rng.integers(0, len(openers), batch)]
        rows = [prefix + tok.encode(o, add_special_tokens=False).ids for o in starts]
        for opener, (ids, stopped) in zip(starts, generate(target, rows, recipe["question_tokens"],
                                                           stop, sampling=(1.0, 0.95), gen=gen)):
            tokens += len(ids)
            text = (opener + tok.decode(ids, skip_special_tokens=True)).strip()
            if not stopped or len(text) < 12 or text in seen:
                counts["dropped_other"] += 1
            elif not exclusion.keep(text):
                counts["dropped_eval"] += 1
            else:
                seen.add(text)
                kept.append(text)
        log(f"questions: {len(kept)}/{count} ({time.time() - t0:.0f} s)")
    secs = time.time() - t0
    return kept[:count], {**counts, "kept": min(len(kept), count), "seconds": round(secs, 1),
                          "tokens": tokens, "tokens_per_s": round(tokens / secs, 1)}


def write_answers(target, tok, recipe, questions, batch, deadline, log):
    """Greedy answers in batches until done or the deadline. The questions are taken in their
    (random) order, sorted by length only within runs of 4 batches (less padding), so a run cut
    short by the deadline does not keep only the short ones."""
    before, after = recipe["template_before"], recipe["template_after"]
    prompts = [tok.encode(before + q + after, add_special_tokens=False).ids for q in questions]
    run = 4 * batch
    order = np.concatenate([i + np.argsort([len(p) for p in prompts[i : i + run]], kind="stable")
                            for i in range(0, len(prompts), run)] or [np.zeros(0, dtype=int)])
    stop = set(recipe["stop_ids"])
    done, t0, tokens = {}, time.time(), 0
    for i in range(0, len(order), batch):
        if time.time() > deadline:
            break
        rows = order[i : i + batch]
        for r, (ids, _) in zip(rows, generate(target, [prompts[r] for r in rows],
                                              recipe["answer_tokens"], stop)):
            done[int(r)] = ids
            tokens += len(ids)
        log(f"answers: {len(done)}/{len(prompts)}, {tokens} tokens ({time.time() - t0:.0f} s)")
    secs = time.time() - t0
    seqs = [(prompts[r], done[r]) for r in sorted(done)]
    return seqs, {"answers": len(seqs), "answer_tokens": tokens, "seconds": round(secs, 1),
                  "tokens_per_s": round(tokens / secs, 1) if secs else None}


def save_answers(seqs, out: Path, per_file: int = 6_000_000) -> None:
    """The sequences' prompt and answer ids (uint16), each back to back with its offsets, in
    files of at most ``per_file`` tokens (the GPU machine returns files of at most 16 MiB);
    ``read_answers`` reads them back (``--extra``)."""
    files, cur, n = [], [], 0
    for p, a in seqs:
        if cur and n + len(p) + len(a) > per_file:
            files.append(cur)
            cur, n = [], 0
        cur.append((p, a))
        n += len(p) + len(a)
    files.append(cur)
    for k, group in enumerate(files):
        arrays = {}
        for name, part in (("prompt", 0), ("answer", 1)):
            pieces = [np.asarray(s[part], dtype=np.int64) for s in group]
            flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
            assert flat.size == 0 or flat.max() < 2**16, "vocabulary too large for uint16"
            arrays[f"{name}_ids"] = flat.astype(np.uint16)
            arrays[f"{name}_offsets"] = np.cumsum([0] + [len(x) for x in pieces])
        np.savez_compressed(out / f"answers_{k}.npz", **arrays)


def read_answers(path: Path) -> list[tuple[list[int], list[int]]]:
    z = np.load(path)
    po, ao = z["prompt_offsets"], z["answer_offsets"]
    p, a = z["prompt_ids"].astype(np.int64), z["answer_ids"].astype(np.int64)
    return [(p[po[i] : po[i + 1]].tolist(), a[ao[i] : ao[i + 1]].tolist()) for i in range(len(po) - 1)]


# --- features ---------------------------------------------------------------------------------


@torch.no_grad()
def write_features(target, seqs, aux, max_tokens, log):
    """Teacher forcing over every prompt+answer: flat arrays (rows = tokens, sequences back to
    back): aux float16 (N, A*H), ids, labels (the argmax at each position), mask (1 where the
    next token is an answer token: positions P-1..T-1, as ``features.py``), offsets."""
    dev = target.embed.device
    lengths = np.array([len(p) + len(a) for p, a in seqs])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    N, A, H = int(offsets[-1]), len(aux), target.c["hidden_size"]
    feats = torch.empty(N, A * H, dtype=torch.float16, device=dev)
    labels = torch.empty(N, dtype=torch.long, device=dev)
    ids_all = torch.tensor(np.concatenate([p + a for p, a in seqs]), dtype=torch.long, device=dev)
    mask = np.zeros(N, dtype=bool)
    for s, (p, _) in enumerate(seqs):
        mask[offsets[s] + len(p) - 1 : offsets[s + 1]] = True
    order = np.argsort(lengths, kind="stable")
    t0, i = time.time(), 0
    while i < len(order):
        T = int(lengths[order[i]])
        j = i
        while j < len(order) and (j - i + 1) * int(lengths[order[j]]) <= max_tokens:
            j += 1
        rows, T = order[i : max(j, i + 1)], int(lengths[order[max(j, i + 1) - 1]])
        B = len(rows)
        ids = torch.zeros(B, T, dtype=torch.long, device=dev)
        for b, s in enumerate(rows):
            ids[b, : lengths[s]] = ids_all[offsets[s] : offsets[s + 1]]
        pos = torch.arange(T, device=dev)[None].expand(B, T)
        causal = (pos[0][:, None] >= pos[0][None, :])[None].expand(B, T, T)
        logits, _, fs = target.forward(ids, pos, causal, aux=aux)
        f = torch.cat(fs, dim=-1).half()
        am = logits.argmax(-1)
        for b, s in enumerate(rows):
            a, n = offsets[s], lengths[s]
            feats[a : a + n], labels[a : a + n] = f[b, :n], am[b, :n]
        i += B
    secs = time.time() - t0
    follows = mask.copy()
    follows[offsets[1:] - 1] = False  # the last position's next token is not in the sequence
    follows_t = torch.tensor(follows[:-1], device=dev)
    agree = float((labels[:-1] == ids_all[1:])[follows_t].float().mean())
    log(f"features: {N} tokens in {secs:.0f} s; labels agree with the answers at {agree:.2%}")
    return {"aux": feats, "ids": ids_all, "labels": labels,
            "mask": torch.tensor(mask, device=dev), "offsets": offsets,
            "report": {"tokens": N, "seconds": round(secs, 1), "tokens_per_s": round(N / secs, 1),
                       "label_agreement": round(agree, 5)}}


# --- the head ---------------------------------------------------------------------------------


class Eagle3(torch.nn.Module):
    """``heads/eagle3.py``'s Eagle3Head with the same parameter names."""

    def __init__(self, H, A, heads, kv, hd, inter, Vd, eps, theta):
        super().__init__()
        L = torch.nn.Linear
        self.fc = L(A * H, H, bias=False)
        self.q_proj, self.k_proj, self.v_proj = L(2 * H, heads * hd, bias=False), L(2 * H, kv * hd, bias=False), L(2 * H, kv * hd, bias=False)
        self.o_proj = L(heads * hd, H, bias=False)
        self.gate_proj, self.up_proj, self.down_proj = L(H, inter, bias=False), L(H, inter, bias=False), L(inter, H, bias=False)
        self.ln_emb, self.ln_h, self.ln_post, self.norm = (torch.nn.Parameter(torch.ones(H)) for _ in range(4))
        self.lm_head = L(H, Vd, bias=False)
        self.heads, self.kv, self.hd, self.eps, self.theta = heads, kv, hd, eps, theta

    NAMES = {"fc.weight": "fc.weight", "q_proj.weight": "layer.self_attn.q_proj.weight",
             "k_proj.weight": "layer.self_attn.k_proj.weight", "v_proj.weight": "layer.self_attn.v_proj.weight",
             "o_proj.weight": "layer.self_attn.o_proj.weight", "gate_proj.weight": "layer.mlp.gate_proj.weight",
             "up_proj.weight": "layer.mlp.up_proj.weight", "down_proj.weight": "layer.mlp.down_proj.weight",
             "ln_emb": "layer.input_layernorm.weight", "ln_h": "layer.hidden_norm.weight",
             "ln_post": "layer.post_attention_layernorm.weight", "norm": "norm.weight",
             "lm_head.weight": "lm_head.weight"}

    def edgespec_weights(self) -> dict[str, np.ndarray]:
        return {self.NAMES[k]: v.detach().float().cpu().numpy() for k, v in self.state_dict().items()}

    def load_edgespec(self, weights: dict[str, np.ndarray]) -> None:
        inv = {v: k for k, v in self.NAMES.items()}
        self.load_state_dict({inv[k]: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in weights.items()})

    def unroll(self, features, emb_next, depth: int) -> list[torch.Tensor]:
        """``Eagle3Head.unroll``: logits (B, T, Vd) for depths 0..depth-1 (the training-time test)."""
        B, T, _ = emb_next.shape
        h = self.fc(features)
        pos = torch.arange(T, device=h.device)[None].expand(B, T)
        e = rms_norm(emb_next, self.ln_emb, self.eps)
        keys, values, out = [], [], []
        for j in range(depth):
            if j:
                h = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)
            x = torch.cat([e, rms_norm(h, self.ln_h, self.eps)], dim=-1)
            q = rope(self.q_proj(x).view(B, T, self.heads, self.hd).transpose(1, 2), pos, self.theta)
            k = rope(self.k_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2), pos, self.theta)
            keys.append(k)
            values.append(self.v_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2))
            a = ttt_attention(q, keys, values, self.hd**-0.5).transpose(1, 2).reshape(B, T, -1)
            r = h + self.o_proj(a)
            m = rms_norm(r, self.ln_post, self.eps)
            h = r + self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m))
            out.append(self.lm_head(rms_norm(h, self.norm, self.eps)))
        return out


def _shift(x: torch.Tensor, s: int) -> torch.Tensor:
    """Rows moved s places later along axis 2 (zeros in front)."""
    if s == 0:
        return x
    return torch.cat([torch.zeros_like(x[:, :, :s]), x[:, :, :-s]], dim=2)


def ttt_attention(q, keys, values, scale):
    """``heads/eagle3._ttt_attention``: depth j's query p sees depth-0 keys at <= p-j and depth
    i's key at p-j+i."""
    j = len(keys) - 1
    B, Hq, T, D = q.shape
    kv = keys[0].shape[1]
    qg = (q * scale).reshape(B, kv, Hq // kv, T, D)
    p = torch.arange(T, device=q.device)
    scores = [(qg @ keys[0][:, :, None].transpose(-1, -2)).float().masked_fill(
        ~(p[None, :] <= p[:, None] - j), -math.inf)]
    for i in range(1, j + 1):
        ks = _shift(keys[i], j - i)[:, :, None]
        s = (qg * ks).sum(-1, keepdim=True).float()
        scores.append(s.masked_fill(~(p >= j - i)[:, None], -math.inf))
    w = torch.softmax(torch.cat(scores, dim=-1), dim=-1).nan_to_num(0.0).to(values[0].dtype)
    out = w[..., :T] @ values[0][:, :, None]
    for i in range(1, j + 1):
        out = out + w[..., T + i - 1 : T + i] * _shift(values[i], j - i)[:, :, None]
    return out.reshape(B, Hq, T, D)


def head_loss(head, batch, depth, decay=0.8):
    """``eagle3_loss`` with hard labels: per depth the mean cross-entropy of its rows (labels
    outside the draft vocabulary left out) weighted decay^j, and per depth top-1 agreement."""
    logits = head.unroll(batch["features"], batch["emb_next"], depth)
    labels, draft, rows = batch["labels"], batch["draft"], batch["mask"].float()
    T = labels.shape[1]
    loss, top1 = 0.0, []
    for j, lg in enumerate(logits):
        valid = rows * (torch.arange(T, device=lg.device) >= j)
        trains = valid * (draft >= 0)
        ce = F.cross_entropy(lg.float().flatten(0, 1), draft.clamp(min=0).flatten(), reduction="none")
        loss = loss + decay**j * (ce.view_as(trains) * trains).sum() / trains.sum().clamp(min=1)
        hit = (batch["ids"][lg.argmax(-1)] == labels).float()
        top1.append(((hit * valid).sum() / valid.sum().clamp(min=1)).item())
    return loss, top1


# --- training ---------------------------------------------------------------------------------


def batches(seq_ids, offsets, max_tokens, rng):
    """Sequences grouped by length into batches of <= max_tokens padded rows, in a seeded order."""
    lengths = offsets[1:] - offsets[:-1]
    order = sorted(seq_ids, key=lambda s: (lengths[s], rng.random()))
    out, cur = [], []
    for s in order:
        if cur and (len(cur) + 1) * lengths[s] > max_tokens:
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    return [out[i] for i in rng.permutation(len(out))]


def make_batch(store, seqs, embed, index, ids_of):
    """Rows p = 0..T-2 of each sequence: features at p, emb(x_{p+1}), label = argmax at p+1,
    trains where the mask is set at p+1 (``objectives.Eagle3Objective.batch``)."""
    offs = store["offsets"]
    T = max(int(offs[s + 1] - offs[s]) for s in seqs) - 1
    dev = embed.device
    B = len(seqs)
    idx = torch.zeros(B, T, dtype=torch.long, device=dev)
    ok = torch.zeros(B, T, dtype=torch.bool, device=dev)
    for b, s in enumerate(seqs):
        n = int(offs[s + 1] - offs[s]) - 1
        idx[b, :n] = torch.arange(int(offs[s]), int(offs[s]) + n, device=dev)
        ok[b, :n] = True
    nxt = idx + 1
    labels = store["labels"][nxt]
    return {"features": store["aux"][idx].float(), "emb_next": embed[store["ids"][nxt]],
            "labels": labels, "draft": index[labels], "mask": ok & store["mask"][nxt],
            "ids": ids_of}


def train(target, store, args, deadline, out: Path, report: dict, log):
    dev = target.embed.device
    n = len(store["offsets"]) - 1
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(n)
    n_held = max(1, round(args.held_out * n))
    held, trn = sorted(order[:n_held].tolist()), sorted(order[n_held:].tolist())
    # the draft vocabulary: the most frequent labels at trained positions of the training split
    offs, mask, labels = store["offsets"], store["mask"], store["labels"]
    in_train = torch.zeros(len(mask), dtype=torch.bool, device=dev)
    for s in trn:
        in_train[int(offs[s]) : int(offs[s + 1])] = True
    V = target.c["vocab_size"]
    counts = torch.bincount(labels[mask & in_train], minlength=V).cpu().numpy()
    top = np.lexsort((np.arange(V), -counts))[: args.draft_vocab]
    ids = np.sort(top)
    index = torch.full((V,), -1, dtype=torch.long, device=dev)
    index[torch.tensor(ids, device=dev)] = torch.arange(len(ids), device=dev)
    ids_t = torch.tensor(ids, device=dev)
    held_labels = labels[mask & ~in_train]
    coverage = float((index[held_labels] >= 0).float().mean())
    c = target.c
    head = Eagle3(c["hidden_size"], len(args.aux), c["num_attention_heads"], c["num_key_value_heads"],
                  target.hd, c["intermediate_size"], len(ids), target.eps, target.theta).to(dev)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.head[ids_t])
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0, eps=1e-8)
    per_epoch = len(batches(trn, offs, args.batch_tokens, np.random.default_rng(0)))
    plan = {"total": max(1, int(per_epoch * args.epochs))}
    warm = max(1, int(0.03 * plan["total"]))

    def lr_factor(s):  # linear warm-up, then cosine to 1/20 over the planned steps
        done = min(1.0, max(0, s - warm) / max(1, plan["total"] - warm))
        return min((s + 1) / warm, 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * done)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    total = plan["total"]
    report["train"] = {"sequences": len(trn), "held_sequences": len(held), "draft_vocab": len(ids),
                       "held_out_label_coverage": round(coverage, 4), "steps_planned": total,
                       "epochs_planned": args.epochs, "evals": []}
    step, t0, rows_done = 0, time.time(), 0
    for epoch in range(math.ceil(args.epochs)):
        for group in batches(trn, offs, args.batch_tokens, np.random.default_rng([args.seed, epoch])):
            if step >= total or time.time() > deadline:
                break
            b = make_batch(store, group, target.embed, index, ids_t)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                loss, _ = head_loss(head, b, args.depths)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), args.clip)
            opt.step()
            sched.step()
            step += 1
            rows_done += int(b["mask"].sum())
            if step == FIT_AFTER:  # the schedule shrinks to what the deadline leaves room for
                per_step = (time.time() - t0) / step
                room = int((deadline - time.time() - args.reserve_s) / per_step)
                plan["total"] = total = max(step + 1, min(total, step + room))
                report["train"]["steps_planned"] = total
                log(f"training: {per_step * 1000:.0f} ms a step; {total} steps "
                    f"({total / per_epoch:.2f} epochs) fit before the deadline")
        ev = evaluate(head, store, held, target.embed, index, ids_t, args)
        ev.update(epoch=epoch + 1, step=step, seconds=round(time.time() - t0, 1))
        report["train"]["evals"].append(ev)
        log(f"epoch {epoch + 1}: step {step}/{total}, held-out {ev}")
        save_head(head, ids, out)
        report["train"].update(steps_done=step, rows_per_s=round(rows_done / (time.time() - t0), 1))
        (out / "report.json").write_text(json.dumps(report, indent=1))
        if step >= total or time.time() > deadline:
            break
    return head, ids


FIT_AFTER = 20  # steps timed before the schedule is fitted to the deadline


@torch.no_grad()
def evaluate(head, store, held, embed, index, ids_t, args):
    sums, weight, loss_sum = np.zeros(args.depths), 0.0, 0.0
    for group in batches(held, store["offsets"], args.batch_tokens, np.random.default_rng(0)):
        b = make_batch(store, group, embed, index, ids_t)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=embed.device.type == "cuda"):
            loss, top1 = head_loss(head, b, args.depths)
        w = float(b["mask"].sum())
        sums += np.array(top1) * w
        loss_sum += float(loss) * w
        weight += w
    return {"loss": round(loss_sum / weight, 4),
            **{f"d{j}": round(float(v / weight), 4) for j, v in enumerate(sums)}}


def save_head(head, ids, out: Path):
    from safetensors.numpy import save_file

    w = {k: v.astype(np.float16) for k, v in head.edgespec_weights().items()}
    lm = w.pop("lm_head.weight")
    save_file(w, str(out / "head_layer.safetensors"))
    save_file({"lm_head.weight": lm, "draft_ids": ids.astype(np.int64)}, str(out / "head_lm.safetensors"))


# --- the run ------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--minutes", type=float, default=8.0, help="deadline for all phases")
    ap.add_argument("--questions", type=int, default=40000)
    ap.add_argument("--question-minutes", type=float, default=1.5)
    ap.add_argument("--answer-minutes", type=float, default=3.0)
    ap.add_argument("--gen-batch", type=int, default=1024)
    ap.add_argument("--feature-tokens", type=int, default=65536, help="padded tokens per teacher-forcing forward")
    ap.add_argument("--batch-tokens", type=int, default=16384, help="padded rows per training step")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--depths", type=int, default=4)
    ap.add_argument("--epochs", type=float, default=8.0)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--held-out", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--extra", type=Path, nargs="*", default=[],
                    help="answers_K.npz files of earlier runs: trained on too (their questions "
                         "passed the same exclusion)")
    ap.add_argument("--extra-questions", type=Path, nargs="*", default=[],
                    help="questions.jsonl.gz of earlier runs: new questions equal to one are dropped")
    ap.add_argument("--reserve-s", type=float, default=30.0,
                    help="seconds kept after training for the last evaluation and save")
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer

    start = time.time()
    deadline = start + 60 * args.minutes
    args.out.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(f"[{time.time() - start:6.1f}s] {msg}", flush=True)

    torch.backends.cuda.matmul.allow_tf32 = False  # the target in true float32
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    recipe = json.loads((args.bundle / "recipe.json").read_text())
    args.aux = tuple(recipe["aux_layers"])
    tok = Tokenizer.from_file(str(args.bundle / "model/tokenizer.json"))
    exclusion = load_exclusion(args.repo, args.bundle / "eval")
    config, weights = load_weights(args.bundle / "model")
    target = Target(config, weights, dev)
    report = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
              "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()},
              "eval_prompts_excluded": len(exclusion)}
    log(f"target loaded on {report['device']}; {len(exclusion)} evaluation prompts excluded")
    check = recipe.get("check")
    if check:  # edgespec's own greedy continuation of one prompt, made on the CPU
        got = generate(target, [check["prompt_ids"]], len(check["answer_ids"]), set())[0][0]
        same = next((i for i, (a, b) in enumerate(zip(got, check["answer_ids"])) if a != b), len(got))
        report["check_tokens_equal"] = f"{same}/{len(check['answer_ids'])}"
        log(f"greedy check against edgespec: first {same} of {len(got)} tokens equal")
    earlier = [json.loads(line)["prompt"] for path in args.extra_questions
               for line in gzip.open(path, "rt")]
    questions, report["questions"] = write_questions(
        target, tok, recipe, exclusion, args.questions, args.gen_batch, args.seed,
        min(deadline, time.time() + 60 * args.question_minutes), log, seen=earlier)
    with gzip.open(args.out / "questions.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"id": i, "prompt": q}) + "\n" for i, q in enumerate(questions))
    seqs, report["answers"] = write_answers(target, tok, recipe, questions, args.gen_batch,
                                            min(deadline, time.time() + 60 * args.answer_minutes), log)
    save_answers(seqs, args.out)
    for path in args.extra:  # sequences from earlier runs, trained on with this run's
        more = read_answers(path)
        report.setdefault("extra", []).append({"file": path.name, "sequences": len(more),
                                               "answer_tokens": sum(len(a) for _, a in more)})
        seqs += more
    # TF32 products here: the features are stored in float16 (the same rounding), and a label
    # flips only where two logits tie within it (the agreement with the answers says how often)
    torch.backends.cuda.matmul.allow_tf32 = True
    store = write_features(target, seqs, args.aux, args.feature_tokens, log)
    report["features"] = store.pop("report")
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    train(target, store, args, deadline, args.out, report, log)
    report["total_seconds"] = round(time.time() - start, 1)
    if dev.type == "cuda":
        report["peak_gpu_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    log("done")


if __name__ == "__main__":
    main()
