"""How often an EAGLE-3 head's top-1 draft agrees with the model, per draft depth, on the
model's own greedy answers to evaluation prompts (teacher-forced: the head sees the true
features and tokens, as in training's held-out split).

    python scripts/head_agreement.py HEAD_DIR [HEAD_DIR ...] [--limit 8] [--max-tokens 128]

``edgespec train`` reports the same numbers on its held-out split, which comes from the same
source as the training data (questions the model wrote itself). This asks the other question:
does what the head learnt carry over to the prompts the bench measures? The prompts are every
``--stride``-th MT-bench first turn (measuring only: nothing here trains or tunes anything).
The answers are generated once with plain greedy decoding and scored by every head given.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import edgespec  # noqa: F401  (first: it loads the optimized BLAS before MLX starts)
import mlx.core as mx
import numpy as np
from tqdm import tqdm

from edgespec.engine import Engine
from edgespec.heads.eagle3 import eagle3_loss
from edgespec.heads.formats import load_head
from edgespec.loading.hub import resolve_model
from edgespec.targets import load_target

EVAL = Path(__file__).resolve().parents[2] / "shared" / "eval" / "mt_bench.jsonl"


def batch_of(target, ids: list[int], prompt_len: int, aux: tuple[int, ...]) -> dict:
    """The training batch layout (``objectives.Eagle3Objective``) of one scored sequence: row
    p = (features at p, emb(x_{p+1})), label = the model's argmax at p+1, trained where that
    label is an answer token."""
    out = target.score(ids, target.make_cache(), capture=aux)
    T = len(ids)
    labels = mx.argmax(out.logits, axis=-1).astype(mx.int32)
    mask = np.zeros(T, dtype=np.uint8)
    mask[max(prompt_len - 2, 0) : T - 2] = 1
    return {"features": mx.concatenate([out.captured[i] for i in aux], axis=-1)[None],
            "emb_next": target.model.embed(mx.array(ids[1:] + [0]))[None],
            "labels": mx.concatenate([labels[1:], mx.zeros((1,), mx.int32)])[None],
            "mask": mx.array(mask)[None]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("heads", nargs="+")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--prompts", default=str(EVAL))
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--stride", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--depths", type=int, default=4)
    a = ap.parse_args(argv)
    target = load_target(resolve_model(a.model), dtype="float32")
    heads = [load_head(h, target)[1] for h in a.heads]
    lines = Path(a.prompts).read_text().splitlines()
    records = [json.loads(x) for x in lines if x.strip()][:: a.stride][: a.limit]
    hits = np.zeros((len(heads), a.depths))
    rows = np.zeros(a.depths)
    engine = Engine(target)  # plain greedy decoding
    for rec in tqdm(records, desc="answers + agreement", file=sys.stderr):
        text = rec["turns"][0] if "turns" in rec else rec.get("prompt", "")
        messages = [{"role": "user", "content": text}]
        ids = engine.encode(messages)
        full = ids + engine.generate(messages, max_tokens=a.max_tokens).token_ids
        for h, head in enumerate(heads):
            b = batch_of(target, full, len(ids), tuple(head.config.aux_layers))
            _, top1 = eagle3_loss(head, b, a.depths)
            valid = [float((b["mask"][0].astype(mx.float32) * (mx.arange(len(full)) >= j)).sum())
                     for j in range(a.depths)]
            hits[h] += [float(t) * v for t, v in zip(top1, valid)]
            if h == 0:
                rows += valid
    print(f"{len(records)} prompts (every {a.stride}th of {a.prompts}) × ≤{a.max_tokens} greedy "
          f"tokens; top-1 agreement with the model per draft depth")
    print("| head | " + " | ".join(f"depth {j + 1}" for j in range(a.depths)) + " |")
    print("|---|" + "---:|" * a.depths)
    for name, hh in zip(a.heads, hits):
        print(f"| {name} | " + " | ".join(f"{x:.3f}" for x in hh / np.maximum(rows, 1)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
