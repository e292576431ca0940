"""What each head kind trains on: windows of the feature store -> a batch -> the heads' own loss.

Contract: an objective has ``module`` (the parameters that train), ``names`` (one per metric the
loss returns: per-depth or per-head top-1 agreement with the target), ``batch(windows)`` (the
padded mx arrays of those windows) and ``loss(module, batch) -> (loss, metrics)``, which is the
heads package's own loss (``eagle3_loss``, ``medusa_loss``). A window is ``(sequence, a, b)``:
rows ``a..b-1`` of that sequence, ``row`` meaning a position whose prediction trains.

Row conventions (``heads.md``):
- EAGLE-3 row p: features at p, ``emb(x_{p+1})``, label = the target's argmax at p+1, trains when
  the store's mask is set at p+1. Rows run 0 .. T-2 (the last position has no next token).
- Medusa row t: ``norm(hidden_t)``; head i's label is the argmax at t+1+i; rows start where the
  first label is (the rows are independent, so the prompt's add nothing). The loss reads the
  argmax of the rows after the window, so a batch carries K rows past ``b`` (not trained); a row
  trains when every head's label is in the sequence and labelled (mask at t+1 and at t+K): the
  last K-1 rows of an answer are left out for the nearer heads, a price of ~K/250 of the rows for
  one row mask per position.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..heads.eagle3 import Eagle3Head, eagle3_loss
from ..heads.medusa import MedusaHeads, medusa_loss, target_lm_head
from .features import FeatureStore


PAD_TO = 64
"""Batches are padded to a multiple of this many rows (untrained rows), so a compiled training
step (``trainer``) sees a few shapes rather than one per window length."""


def _pad(rows: list[np.ndarray], fill=0) -> np.ndarray:
    T = -(-max(len(r) for r in rows) // PAD_TO) * PAD_TO
    out = np.full((len(rows), T) + rows[0].shape[1:], fill, dtype=rows[0].dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


class Eagle3Objective:
    def __init__(self, head: Eagle3Head, target, store: FeatureStore, depth: int,
                 soft: bool = False):
        """``soft``: train on the target's top-K probabilities (the store's ``soft_ids`` /
        ``soft_p``) instead of its argmax alone."""
        if soft and store.soft_ids is None:
            raise ValueError(f"the feature store {store.folder} has no soft labels (made without "
                             "--soft-labels)")
        self.module, self.store, self.depth, self.soft = head, store, depth, soft
        self.embed = target.model.embed
        self.names = [f"d{j}" for j in range(depth)]

    def rows(self, mask: np.ndarray) -> tuple[int, int]:
        """The rows a sequence (its store mask) contributes: every position with a next token
        (the prompt's rows train nothing but are the attention's context)."""
        return 0, len(mask) - 1

    def batch(self, windows: list[tuple[int, int, int]]) -> dict:
        st = self.store
        feats, nxt, labels, mask, sid, sp = [], [], [], [], [], []
        for s, a, b in windows:
            r = st.rows(s).start
            feats.append(np.asarray(st.aux[r + a : r + b]))
            nxt.append(np.asarray(st.ids[r + a + 1 : r + b + 1]))
            labels.append(np.asarray(st.labels[r + a + 1 : r + b + 1]))
            mask.append(np.asarray(st.mask[r + a + 1 : r + b + 1]))
            if self.soft:
                sid.append(np.asarray(st.soft_ids[r + a + 1 : r + b + 1]))
                sp.append(np.asarray(st.soft_p[r + a + 1 : r + b + 1]))
        labels = np.maximum(_pad(labels), 0)
        out = {"features": mx.array(_pad(feats)).astype(mx.float32),
               "emb_next": self.embed(mx.array(_pad(nxt))).astype(mx.float32),
               "labels": mx.array(labels), "mask": mx.array(_pad(mask))}
        if self.soft:
            out["soft_ids"] = mx.array(_pad(sid, fill=-1))
            out["soft_p"] = mx.array(_pad(sp)).astype(mx.float32)
        return out

    def loss(self, module, batch):
        return eagle3_loss(module, batch, self.depth)


class MedusaObjective:
    def __init__(self, heads: MedusaHeads, target, store: FeatureStore):
        self.module, self.store = heads, store
        self.K = heads.config.num_heads
        self.norm = target.model.model.norm
        self.target_head = (None if heads.config.own_lm_head
                            else target_lm_head(target, heads.draft_ids))
        self.names = [f"h{i}" for i in range(self.K)]

    def rows(self, mask: np.ndarray) -> tuple[int, int]:
        """From the first row that trains (rows are independent: no context needed)."""
        first = int(np.argmax(mask > 0))  # P-1: the first labelled position; row P-2 predicts it
        return max(first - 1, 0), len(mask) - 1

    def batch(self, windows: list[tuple[int, int, int]]) -> dict:
        st, K = self.store, self.K
        hidden, argmax, mask = [], [], []
        for s, a, b in windows:
            rs = st.rows(s)
            r, T = rs.start, rs.stop - rs.start
            end = min(b + K, T)  # K rows past the window: the labels of its last rows
            hidden.append(np.asarray(st.hidden[r + a : r + end]))
            argmax.append(np.asarray(st.labels[r + a : r + end]))
            m = np.asarray(st.mask[r:r + T])
            t = np.arange(a, b)
            ok = (t + K < T) & (m[np.minimum(t + 1, T - 1)] > 0) & (m[np.minimum(t + K, T - 1)] > 0)
            row = np.zeros(end - a, dtype=np.uint8)
            row[: b - a] = ok
            mask.append(row)
        h = mx.array(_pad(hidden)).astype(mx.float32)
        return {"hidden": self.norm(h), "argmax": mx.array(np.maximum(_pad(argmax), 0)),
                "mask": mx.array(_pad(mask))}

    def loss(self, module, batch):
        return medusa_loss(module, batch, self.target_head)

    def topk_accuracy(self, windows: list[tuple[int, int, int]], k: int = 8,
                      batch_size: int = 2) -> list[list[float]] | None:
        """Per head, the share of the windows' trained rows whose label is among the head's
        ``k`` best guesses, for 1..k guesses (the Medusa drafter chooses its tree's shape from
        it); None when a head has no trained row there. With a draft vocabulary, a label
        outside it is a miss at every k."""
        K, draft = self.K, self.module.draft_ids is not None
        k = min(k, self.module.config.draft_vocab_size or self.module.config.vocab_size)
        hits, rows = np.zeros((K, k)), np.zeros(K)
        for i in range(0, len(windows), batch_size):
            batch = self.batch(windows[i : i + batch_size])
            hidden, argmax = batch["hidden"], batch["argmax"]
            B, T, H = hidden.shape
            logits = self.module(hidden.reshape(B * T, H), self.target_head)
            logits = logits.reshape(K, B, T, logits.shape[-1])
            mask = np.array(batch["mask"]) > 0
            for h in range(K):
                s = 1 + h
                if s >= T:
                    continue
                lg, labels = logits[h][:, : T - s], argmax[:, s:]
                want = np.array(self.module.to_draft_ids(labels) if draft else labels)
                top = mx.argpartition(-lg, k - 1, axis=-1)[..., :k]
                order = mx.argsort(-mx.take_along_axis(lg, top, axis=-1), axis=-1)
                top = np.array(mx.take_along_axis(top, order, axis=-1))  # best first
                found = np.cumsum(top == want[..., None], axis=-1) > 0  # within the first j+1
                valid = mask[:, : T - s]
                hits[h] += found[valid].sum(axis=0)
                rows[h] += valid.sum()
        if not rows.all():
            return None
        return np.round(hits / rows[:, None], 4).tolist()
