"""The EAGLE-3 head for ``gpu_distill.py``, in PyTorch: ``heads/eagle3.py``'s ``Eagle3Head``
(same math, same parameter names), its training-time test and loss, and training on the
run's feature store (AdamW, warm-up + cosine fitted to the deadline, clipping, bfloat16
autocast on a GPU, a held-out split evaluated and the head saved after every epoch).
``tests/test_gpu_distill.py`` holds the unroll and the loss to ``Eagle3Head``'s on the CPU."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from gpu_target import rms_norm, rope


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
