"""Records (and replayed general data) -> one feature store the trainer reads.

Contract: ``build(folder, records, replay, hidden_size, aux_layers)`` writes a
``training.features`` store (without the ``hidden`` array: EAGLE-3 does not read it) whose
sequences are the given records, then the replay store's sequences, and returns it opened.
A record's rows become a sequence: ``ids`` the token at each row, ``labels[t]`` the token that
followed row t (what decoding committed: the target's greedy token under greedy decoding, a
draw from its distribution under sampling), ``mask`` set from the row of the prompt's last token
on (rows that predict the answer train; the prompt rows are attention context), as the recipe's
teacher-forced store is laid out. The folder is written whole under a temporary name and renamed,
and is named by what it holds (``digest``), so a rerun over the same data reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..training.features import FeatureStore
from .store import Record


def digest(records: list[Record], replay: FeatureStore | None) -> str:
    h = hashlib.sha256()
    for r in records:
        h.update(r.name.encode())
    if replay is not None:
        h.update(json.dumps(replay.meta, sort_keys=True).encode())
    return h.hexdigest()[:16]


def build(folder: Path, records: list[Record], replay: FeatureStore | None, hidden_size: int,
          aux_layers: tuple[int, ...]) -> FeatureStore:
    """The store of ``records`` + ``replay`` in ``folder`` (made once; see the module doc)."""
    folder = Path(folder)
    if (folder / "meta.json").is_file():
        return FeatureStore.open(folder)
    lengths = [r.rows for r in records] + (
        [int(b - a) for a, b in zip(replay.offsets[:-1], replay.offsets[1:])] if replay else [])
    n, width = int(sum(lengths)), len(aux_layers) * hidden_size
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, mode=0o700)

    def array(name, shape, dtype):
        return np.lib.format.open_memmap(tmp / f"{name}.npy", mode="w+", dtype=dtype, shape=shape)

    aux, ids = array("aux", (n, width), np.float16), array("ids", (n,), np.int32)
    labels, mask = array("labels", (n,), np.int32), array("mask", (n,), np.uint8)
    at = 0
    for r in records:
        a, tokens = r.arrays()
        t = a.shape[0]
        aux[at : at + t], ids[at : at + t] = a, tokens[:t]
        labels[at : at + t] = tokens[1 : t + 1]
        mask[at : at + t] = 0
        mask[at + r.meta["answer_row"] : at + t] = 1
        at += t
    if replay is not None:
        t = replay.tokens
        for name, dst in (("aux", aux), ("ids", ids), ("labels", labels), ("mask", mask)):
            src = getattr(replay, name)
            for a in range(0, t, 8192):  # in pieces: the replay's arrays are memory-mapped
                dst[at + a : at + min(a + 8192, t)] = src[a : min(a + 8192, t)]
        at += t
    for arr in (aux, ids, labels, mask):
        arr.flush()
    del aux, ids, labels, mask
    np.save(tmp / "offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    user_tokens = sum(r.answer_tokens for r in records)
    meta = {"version": 1, "aux_layers": list(aux_layers), "hidden_size": hidden_size,
            "no_hidden": True, "soft_k": 0, "sequences": len(lengths), "tokens": n,
            "user_sequences": len(records), "user_answer_tokens": user_tokens,
            "replay_sequences": len(lengths) - len(records)}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return FeatureStore.open(folder)
