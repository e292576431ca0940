"""A GGUF's Q6_K layers kept quantized, rounded to 8 bits, against the same layers as the file's
exact float32 values (``EDGESPEC_Q6K=float``), both loads otherwise alike (``--dtype auto``).

Usage: python scripts/q6k_rounding.py [MODEL] [ROUNDS] [TOKENS] [PROMPTS] — default
gemma3-270m, 3 rounds, 64 tokens, the first 8 questions of
``data/SmolLM2-135M-Instruct/heldout-questions.jsonl`` as raw text (the 270M file is a base
model; the file is never an evaluation prompt set).

Prints:

- what each load streams a token (the layers' bytes as loaded);
- fidelity: for every prompt, the rounded model's greedy tokens against the float one's (equal,
  or the first position they part), and the largest logit difference and top-1 agreement with
  both models fed the float model's own greedy text (teacher forcing);
- speed: plain decoding of every prompt by each load in turn, ``ROUNDS`` times (the loads take
  turns, so the machine's drift lands on both), with each round's ratio and their median.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from edgespec.engine import Engine
from edgespec.targets import load

HELDOUT = (Path(__file__).resolve().parent.parent
           / "data/SmolLM2-135M-Instruct/heldout-questions.jsonl")


def loaded(model: str, q6k: str):
    os.environ["EDGESPEC_Q6K"] = q6k
    return load(model, dtype="auto", progress=False)


def weight_mb(target) -> float:
    return sum(v.nbytes for _, v in tree_flatten(target.model.parameters())) / 2**20


def greedy(target, prompt: str, tokens: int) -> list[int]:
    return [t for step in Engine(target).stream(prompt, max_tokens=tokens) for t in step.token_ids]


def main(model: str = "gemma3-270m", rounds: str = "3", tokens: str = "64",
         prompts: str = "8") -> None:
    questions = [json.loads(line)["turns"][0] for line in HELDOUT.read_text().splitlines()]
    texts = questions[: int(prompts)]
    loads = {"rounded": loaded(model, "8"), "float": loaded(model, "float")}
    for name, target in loads.items():
        rounded = {k: len(v) for k, v in target.model.rounded.items()}
        print(f"{name:8s} {weight_mb(target):7.1f} MB of weights, rounded layers {rounded}")
    same, worst, agree, total = 0, 0.0, 0, 0
    for text in texts:
        a = greedy(loads["rounded"], text, int(tokens))
        b = greedy(loads["float"], text, int(tokens))
        part = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        same += a == b
        ids = loads["float"].tokenizer.encode(text) + b
        la = np.array(loads["rounded"].score(ids, loads["rounded"].make_cache()).logits)
        lb = np.array(loads["float"].score(ids, loads["float"].make_cache()).logits)
        worst = max(worst, float(np.abs(la - lb).max()))
        agree += int((la.argmax(-1) == lb.argmax(-1)).sum())
        total += la.shape[0]
        print(f"  {text[:48]!r:52s} {'equal' if a == b else f'part at token {part}'}")
    print(f"greedy outputs equal: {same}/{len(texts)}; teacher-forced: top-1 agreement "
          f"{agree}/{total} positions, largest logit difference {worst:.4f}")
    ratios = []
    for r in range(int(rounds)):
        speed = {}
        for name, target in loads.items():
            t0, n = time.perf_counter(), 0
            for text in texts:
                n += len(greedy(target, text, int(tokens)))
            speed[name] = n / (time.perf_counter() - t0)
        ratios.append(speed["rounded"] / speed["float"])
        print(f"round {r + 1}: rounded {speed['rounded']:.1f} tok/s, float {speed['float']:.1f} "
              f"tok/s, ratio {ratios[-1]:.3f}")
    print(f"median ratio rounded/float: {statistics.median(ratios):.3f}")
    mx.clear_cache()


if __name__ == "__main__":
    main(*sys.argv[1:])
