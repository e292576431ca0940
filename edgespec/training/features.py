"""Teacher forcing: the target scores every prompt + answer once; a head trains on the store.

Contract: ``write_features(target, answers, folder, aux_layers=..., max_seq=..., chunk=...)``
runs ``Target.score(ids, cache, capture=aux_layers)`` over each sequence (chunks of ``chunk``
tokens against one cache per sequence, float32) and fills a store of memory-mapped ``.npy``
arrays, one row per token, sequences back to back:

- ``aux``    float16 (N, len(aux)*H): the hidden states entering the ``aux_layers``, in that order
             (EAGLE-3's features);
- ``hidden`` float16 (N, H): the last layer's output before the final norm (Medusa trains on
             ``norm(hidden)``);
- ``ids``    int32 (N): the tokens;  ``labels`` int32 (N): the target's argmax at each position
             (its prediction of the next token; -1 where not computed);
- ``soft_ids`` int32 (N, K), ``soft_p`` float16 (N, K), only in a store made with ``soft_k=K``:
             the target's K most probable next tokens at each position and their probabilities
             (EAGLE-3's reference loss trains on the target's distribution, not only its argmax;
             0 / -1 where not computed);
- ``mask``   uint8 (N): 1 where the next token is an answer token (or, at the last position, the
             token that would follow the answer): positions P-1 .. T-1 of a sequence whose prompt
             has P tokens. Only those positions carry a label and a loss. Why not the prompt: the
             answers are the target's own greedy continuations, which is what a drafter meets when
             decoding; the prompts start with the same template (system text) in every sequence,
             which a head would learn by heart and which would inflate held-out accuracy. The
             prompt positions still feed EAGLE-3's attention as context.
- ``offsets`` int64 (S+1): sequence s is rows ``offsets[s]:offsets[s+1]``.

``meta.json`` names the layers, sizes and the answers it was made from; ``progress.json`` the
sequences done. A kill loses at most the sequence in flight: the arrays are allocated once, each
sequence is flushed before its marker is written, and a rerun continues after the marker. A store
made from other answers or layers is refused (``StoreMismatch``) rather than mixed.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
from tqdm import tqdm

from ..errors import ConfigError
from .clock import Deadline, passed

ARRAYS = ("aux", "hidden", "ids", "labels", "mask")
SOFT = ("soft_ids", "soft_p")  # present when meta["soft_k"] > 0


def array_names(soft_k: int) -> tuple[str, ...]:
    """The per-token arrays of a store made with ``soft_k``."""
    return ARRAYS + (SOFT if soft_k else ())


class StoreMismatch(ConfigError):
    """A feature folder holds features of other answers, layers or another target."""


def sequences(answers: list[dict], max_seq: int) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) per answer record, in id order, cut to ``max_seq`` tokens;
    records whose prompt leaves no answer token inside ``max_seq`` are left out."""
    out = []
    for rec in sorted(answers, key=lambda r: r["id"]):
        ids = (list(rec["ids"]) + list(rec["answer"]))[:max_seq]
        if len(rec["answer"]) and len(rec["ids"]) < len(ids):
            out.append((ids, len(rec["ids"])))
    return out


def answers_digest(seqs: list[tuple[list[int], int]]) -> str:
    h = hashlib.sha256()
    for ids, p in seqs:
        h.update(np.asarray(ids, dtype=np.int32).tobytes() + p.to_bytes(4, "little"))
    return h.hexdigest()[:16]


@dataclass
class FeatureStore:
    """A read view of a finished store (memory-mapped; nothing is loaded until sliced)."""

    folder: Path
    meta: dict
    offsets: np.ndarray
    aux: np.ndarray
    ids: np.ndarray
    labels: np.ndarray
    mask: np.ndarray
    hidden: np.ndarray | None = None  # None in a store without it (``meta["no_hidden"]``)
    soft_ids: np.ndarray | None = None
    soft_p: np.ndarray | None = None

    @classmethod
    def open(cls, folder: Path) -> FeatureStore:
        folder = Path(folder)
        meta = json.loads((folder / "meta.json").read_text())
        names = [n for n in array_names(meta.get("soft_k", 0))
                 if not (n == "hidden" and meta.get("no_hidden"))]
        arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in names}
        return cls(folder, meta, np.load(folder / "offsets.npy"), **arrays)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def tokens(self) -> int:
        return int(self.offsets[-1])

    def rows(self, s: int) -> slice:
        return slice(int(self.offsets[s]), int(self.offsets[s + 1]))


def _allocate(folder: Path, meta: dict, lengths: list[int]) -> None:
    n = int(sum(lengths))
    width = len(meta["aux_layers"]) * meta["hidden_size"]
    shapes = {"aux": ((n, width), np.float16), "hidden": ((n, meta["hidden_size"]), np.float16),
              "ids": ((n,), np.int32), "labels": ((n,), np.int32), "mask": ((n,), np.uint8)}
    if meta.get("soft_k"):
        k = meta["soft_k"]
        shapes.update(soft_ids=((n, k), np.int32), soft_p=((n, k), np.float16))
    for name, (shape, dtype) in shapes.items():
        arr = np.lib.format.open_memmap(folder / f"{name}.npy", mode="w+", dtype=dtype, shape=shape)
        if name in ("labels", "soft_ids"):
            arr[:] = -1
        arr.flush()
        del arr
    np.save(folder / "offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    write_json(folder / "meta.json", meta)
    write_json(folder / "progress.json", {"done": 0, "seconds": 0.0, "label_agree": [0, 0]})


def write_json(path: Path, data) -> None:
    """``data`` as JSON at ``path``, written whole or not at all (a temporary file renamed)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def _check_meta(folder: Path, meta: dict) -> None:
    have = json.loads((folder / "meta.json").read_text())
    for key in ("aux_layers", "hidden_size", "target", "answers", "sequences", "tokens", "soft_k"):
        if have.get(key, 0) != meta[key]:
            raise StoreMismatch(f"the feature store {folder} was made with {key}={have.get(key)!r}, "
                                f"this run needs {meta[key]!r}; remove that folder or pass another "
                                "--work-dir")


def score_sequence(target, ids: list[int], prompt_len: int, aux_layers: tuple[int, ...],
                   chunk: int, soft_k: int = 0) -> tuple[np.ndarray, ...]:
    """(aux (T, len(aux)*H) f16, hidden (T, H) f16, labels (T,) int32 with -1 before P-1,
    soft_ids (T, soft_k) int32 / soft_p (T, soft_k) f16: the top-``soft_k`` next tokens by the
    target's probability, most probable first, -1 / 0 before P-1)."""
    cache = target.make_cache()
    aux, hidden, labels, soft_ids, soft_p = [], [], [], [], []
    for start in range(0, len(ids), chunk):
        piece = ids[start : start + chunk]
        out = target.score(piece, cache, capture=aux_layers, head=False)
        cache.commit()
        first = max(prompt_len - 1 - start, 0)  # labels only where the mask is set
        lab = np.full(len(piece), -1, dtype=np.int32)
        sid = np.full((len(piece), soft_k), -1, dtype=np.int32)
        sp = np.zeros((len(piece), soft_k), dtype=np.float16)
        if first < len(piece):
            logits = target.logits(out.hidden[first:])
            lab[first:] = np.array(mx.argmax(logits, axis=-1).astype(mx.int32))
            if soft_k:
                top = mx.argpartition(-logits, soft_k - 1, axis=-1)[:, :soft_k]
                vals = mx.take_along_axis(logits, top, axis=-1)
                order = mx.argsort(-vals, axis=-1)  # most probable first
                top = mx.take_along_axis(top, order, axis=-1)
                logp = mx.take_along_axis(vals, order, axis=-1) - mx.logsumexp(
                    logits, axis=-1, keepdims=True)
                sid[first:] = np.array(top.astype(mx.int32))
                sp[first:] = np.array(mx.exp(logp).astype(mx.float16))
        feats = mx.concatenate([out.captured[i] for i in aux_layers], axis=-1)
        aux.append(np.array(feats.astype(mx.float16)))
        hidden.append(np.array(out.hidden.astype(mx.float16)))
        labels.append(lab)
        soft_ids.append(sid)
        soft_p.append(sp)
    return (np.concatenate(aux), np.concatenate(hidden), np.concatenate(labels),
            np.concatenate(soft_ids), np.concatenate(soft_p))


def write_features(target, answers: list[dict], folder: Path, *, aux_layers: tuple[int, ...],
                   max_seq: int, chunk: int = 512, fingerprint: str = "", soft_k: int = 0,
                   deadline: Deadline | None = None) -> dict:
    """Fill (or finish) the store in ``folder``; returns counts, seconds and tokens/s.

    Stops early (``complete`` False) once ``deadline`` has passed.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    seqs = sequences(answers, max_seq)
    lengths = [len(ids) for ids, _ in seqs]
    meta = {"version": 1, "aux_layers": list(aux_layers), "hidden_size": target.args.hidden_size,
            "target": fingerprint, "answers": answers_digest(seqs), "sequences": len(seqs),
            "tokens": int(sum(lengths)), "max_seq": max_seq, "soft_k": soft_k}
    if (folder / "progress.json").exists():
        _check_meta(folder, meta)
    else:
        _allocate(folder, meta, lengths)
    progress = json.loads((folder / "progress.json").read_text())
    done = progress["done"]
    arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r+")
              for name in array_names(soft_k)}
    offsets = np.load(folder / "offsets.npy")
    bar = tqdm(total=meta["tokens"], initial=int(offsets[done]), desc="features (teacher forcing)",
               unit="tok", unit_scale=True)
    t0, new_tokens = time.perf_counter(), 0
    agree, compared = progress["label_agree"]
    for s in range(done, len(seqs)):
        if passed(deadline):
            break
        ids, p = seqs[s]
        aux, hidden, labels, sid, sp = score_sequence(target, ids, p, aux_layers, chunk, soft_k)
        rows = slice(int(offsets[s]), int(offsets[s + 1]))
        arrays["aux"][rows], arrays["hidden"][rows] = aux, hidden
        if soft_k:
            arrays["soft_ids"][rows], arrays["soft_p"][rows] = sid, sp
        arrays["ids"][rows], arrays["labels"][rows] = ids, labels
        mask = np.zeros(len(ids), dtype=np.uint8)
        mask[p - 1 :] = 1
        arrays["mask"][rows] = mask
        for arr in arrays.values():
            arr.flush()
        # greedy answers: the label at t (P-1 <= t < T-1) should be the answer's next token
        agree += int((labels[p - 1 : -1] == np.asarray(ids[p:], dtype=np.int32)).sum())
        compared += len(ids) - p
        done, new_tokens = s + 1, new_tokens + len(ids)
        write_json(folder / "progress.json", {
            "done": done, "seconds": progress["seconds"] + time.perf_counter() - t0,
            "label_agree": [agree, compared]})
        bar.update(len(ids))
    bar.close()
    seconds = time.perf_counter() - t0
    total_s = json.loads((folder / "progress.json").read_text())["seconds"]
    all_runs = {"tokens": int(offsets[done]), "seconds": round(total_s, 1),
                "tokens_per_s": round(int(offsets[done]) / total_s, 1) if total_s else None}
    return {"sequences": len(seqs), "tokens": meta["tokens"], "done": done, "all_runs": all_runs,
            "complete": done == len(seqs), "new_tokens": new_tokens, "seconds": round(seconds, 1),
            "tokens_per_s": round(new_tokens / seconds, 1) if new_tokens and seconds else None,
            "label_agreement": round(agree / compared, 4) if compared else None}
