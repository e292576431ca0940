"""Several decodings' shared forward as one native operation against one operation a layer.

Usage: python scripts/batch_stack_ab.py [CLIENTS] [ROUNDS] [METHODS] [MODEL] [DTYPE] — MODEL
(default ``demo``) loaded with DTYPE (default ``auto``: a GGUF's own 4- or 8-bit weights); for
each method of METHODS (comma-separated, default ``none,auto``) and each of ROUNDS rounds
(default 4), CLIENTS decodings (default 4) of 128 greedy tokens, each a held-out question
(``data/SmolLM2-135M-Instruct/heldout-questions.jsonl``, the next CLIENTS each round), run
together in one ``Batch`` (the server's continuous batching, policy ``shared``) twice in turn:
as built (``Decoder.run_many`` through ``DecoderStack.forward_many``, the caches written in
place) and with one block operation a layer and slice updates (``_run_many_stack`` answering
None). The two variants' order alternates from round to round, and their tokens are checked
equal. Prints per method each variant's tokens/s over the whole batch (prefills included), the
median of the rounds' paired ratios and how many rounds were faster as one operation. Run it on
a quiet machine.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
from edgespec import Engine, SamplingConfig, load_target, make_drafter
from edgespec.batch import Batch, Crashed, Ended
from edgespec.options import spec_for
from edgespec.targets.decoder import Decoder
from edgespec.worker import _curve

HELD_OUT = Path(__file__).resolve().parents[1] / "data" / "SmolLM2-135M-Instruct" / \
    "heldout-questions.jsonl"
AS_BUILT = Decoder._run_many_stack
VARIANTS = {"one operation": AS_BUILT, "a layer each": lambda self, *a: None}


def together(target, method: str, questions: list[str], variant: str) -> tuple[float, list]:
    """The questions' decodings in one batch; returns tokens/s over the whole run and each
    decoding's tokens."""
    Decoder._run_many_stack = VARIANTS[variant]
    try:
        engine = Engine(target)
        batch = Batch(target, partial(_curve, target), "shared")
        sampling = SamplingConfig()
        decodings = []
        for q in questions:
            drafter = None if method == "none" else make_drafter(spec_for(method, {}), target,
                                                                 sampling)
            decodings.append(engine.start([{"role": "user", "content": q}], max_tokens=128,
                                          sampling=sampling, drafter=drafter))
        index = {id(d): i for i, d in enumerate(decodings)}
        tokens = [[] for _ in decodings]
        ended: set[int] = set()
        start = time.perf_counter()
        for d in decodings:
            batch.add(d)
        while len(ended) < len(decodings):
            for d, event in batch.round():
                i = index[id(d)]
                if isinstance(event, Crashed):
                    raise event.error
                if isinstance(event, Ended):
                    ended.add(i)
                    continue
                tokens[i] += event.token_ids
                if event.finish_reason is not None:
                    ended.add(i)
        return sum(map(len, tokens)) / (time.perf_counter() - start), tokens
    finally:
        Decoder._run_many_stack = AS_BUILT


def main(clients: str = "4", rounds: str = "4", methods: str = "none,auto",
         model: str = "demo", dtype: str = "auto") -> None:
    c, r = int(clients), int(rounds)
    questions = [json.loads(line)["turns"][0] for line in HELD_OUT.open()]
    if c * r > len(questions):
        raise SystemExit(f"{c} clients x {r} rounds needs {c * r} questions; "
                         f"{HELD_OUT.name} has {len(questions)}")
    target = load_target(model, dtype=dtype)
    together(target, "none", questions[:c], "one operation")  # warm up (the curve, kernels)
    names = list(VARIANTS)
    for method in methods.split(","):
        rates: dict[str, list[float]] = {n: [] for n in names}
        for k in range(r):
            batch_questions = questions[k * c : (k + 1) * c]
            got = {}
            for name in names if k % 2 == 0 else names[::-1]:
                rate, got[name] = together(target, method, batch_questions, name)
                rates[name].append(rate)
            if got[names[0]] != got[names[1]]:
                raise SystemExit(f"{method}: the two variants' tokens differ in round {k}")
        paired = [a / b for a, b in zip(rates[names[0]], rates[names[1]])]
        faster = sum(p > 1 for p in paired)
        print(f"{method}, {c} clients: " + ", ".join(
            f"{n} {statistics.median(v):.1f} tok/s" for n, v in rates.items())
            + f"; paired {statistics.median(paired):.3f}, faster in {faster}/{r}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
