"""Replay a drafter against recorded greedy outputs: τ and an *estimated* speedup, no model needed.

Greedy speculative decoding commits exactly the plain greedy output, so with that output known
(recorded once by `--record`, which runs the model), a deterministic drafter's whole run can be
replayed offline: each step its tree is walked against the true continuation, like
`verify_greedy` does. The cost of a step is read off a forward-cost curve measured with
`edgespec doctor` (ms per forward over N tokens). The result is an estimate for tuning
heuristics quickly; only `edgespec bench` measures speed.

    python scripts/lookup_sim.py --record greedy.json [--limit N]   # runs the demo model once
    python scripts/lookup_sim.py greedy.json                        # replays lookup
    python scripts/lookup_sim.py greedy.json --bound                # what no lookup can beat
    python scripts/lookup_sim.py STORE/answers.jsonl --corpus OTHER/answers.jsonl
                                  # replays the corpus drafter on training answers, its table
                                  # counted over other training answers (held out from it)

Tuning uses training answers only (the ``answers.jsonl`` of an ``edgespec train`` work dir: the
model's greedy answers to questions it wrote itself, prompt ids included; each answer is cut to
128 tokens as in the bench). ``--record`` writes the model's answers to the held-out
evaluation prompts (MT-bench's): those records are for measuring a finished heuristic, never for
choosing one. (Lookup's constants are checked by replaying training answers: see lookup.py.)

``--bound`` replays a clairvoyant prompt lookup: at every step it knows the true continuation,
looks at every earlier occurrence of the last token in the prompt and the answer so far, takes
the one whose continuation matches the truth longest, and drafts exactly as much of it as pays
best on the cost curve. A real lookup drafter sees the same material without knowing which
occurrence is right or how far it holds, so (on the same cost curve) it cannot do better.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np

# ms per target forward over N tokens after 128 tokens of context: the cost curve edgespec
# measured and cached for the demo model (float32, native kernels) on a 2-core AMD EPYC; data
# the replay reads, not a claim about any other machine.
COST_MS = {1: 19.8, 2: 19.7, 3: 19.9, 4: 20.6, 6: 21.3, 8: 22.7, 12: 27.9, 16: 34.2, 24: 47.8,
           32: 60.4, 48: 127.5, 64: 158.9}


def cost(n: int) -> float:
    xs = sorted(COST_MS)
    return float(np.interp(n, xs, [COST_MS[x] for x in xs]))


def replay(drafter, prompt: list[int], output: list[int]) -> tuple[int, float]:
    """(target forwards, estimated ms) for generating ``output`` after ``prompt``."""
    from edgespec.tree import DraftTree
    from edgespec.verify import Accepted

    drafter.prefill(prompt, None)
    done, forwards, ms = 0, 0, 0.0
    while done < len(output):
        tree: DraftTree = drafter.propose(len(output) - done - 1)
        u, path = 0, [0]
        while True:
            want = output[done + len(path) - 1]
            nxt = next((c for c in tree.children(u) if tree.tokens[c] == want), None)
            if nxt is None or done + len(path) >= len(output):
                break
            u = nxt
            path.append(u)
        tokens = [tree.tokens[i] for i in path[1:]] + [output[done + len(path) - 1]]
        drafter.update(Accepted(path, tokens), tree, None)
        done += len(tokens)
        forwards += 1
        ms += cost(len(tree))
    return forwards, ms


def _rows(per_cat: dict) -> dict:
    """τ and estimated speedup per category and overall from [tokens, forwards, ms, plain ms]."""
    rows = {cat: {"tau": t / f, "est_speedup": plain / ms} for cat, (t, f, ms, plain) in per_cat.items()}
    t, f, ms, plain = (sum(v[i] for v in per_cat.values()) for i in range(4))
    rows["overall"] = {"tau": t / f, "est_speedup": plain / ms}
    return rows


def simulate(records: list[dict], make) -> dict:
    per_cat = defaultdict(lambda: [0, 0, 0.0, 0.0])  # tokens, forwards, ms, plain ms
    for r in records:
        f, ms = replay(make(), r["prompt"], r["output"])
        c = per_cat[r["category"]]
        n = len(r["output"])
        c[0] += n
        c[1] += f
        c[2] += ms
        c[3] += n * cost(1)
    return _rows(per_cat)


def clairvoyant(records: list[dict]) -> dict:
    """Per category and overall: τ and estimated speedup of the clairvoyant lookup (``--bound``)."""
    per_cat = defaultdict(lambda: [0, 0, 0.0, 0.0])
    for r in records:
        seq = r["prompt"] + r["output"]
        first, last = len(r["prompt"]), len(seq)
        seen: dict[int, list[int]] = defaultdict(list)  # token -> positions, in the known text
        for i, t in enumerate(seq[: first - 1]):
            seen[t].append(i)
        c, pos = per_cat[r["category"]], first  # seq[pos] is the next token to produce
        while pos < last:
            best = 0
            for j in seen[seq[pos - 1]]:
                n = 0
                while pos + n < last - 1 and j + 1 + n < pos and seq[j + 1 + n] == seq[pos + n]:
                    n += 1
                best = max(best, n)
            d = max(range(best + 1), key=lambda d: (d + 1) / cost(d + 1))
            for i in range(pos - 1, pos + d):
                seen[seq[i]].append(i)
            pos += d + 1
            c[1] += 1
            c[2] += cost(d + 1)
        n = last - first
        c[0] += n
        c[3] += n * cost(1)
    return _rows(per_cat)


def record(path: str, limit: int | None) -> None:
    import edgespec
    from edgespec import Engine
    from edgespec.bench import load_prompts

    target = edgespec.load_target("demo", progress=False)
    eng = Engine(target, reuse_prefix=False)
    out = []
    for p in load_prompts("../shared/eval/mt_bench.jsonl", limit=limit):
        msgs = [{"role": "user", "content": p.text}]
        res = eng.generate(msgs, max_tokens=128)
        out.append({"id": p.id, "category": p.category, "prompt": eng.encode(msgs), "output": res.token_ids})
    with open(path, "w") as f:
        json.dump(out, f)


def read_records(path: str, limit: int | None = None) -> list[dict]:
    """``--record``'s json, or a training work dir's answers.jsonl (prompt ids + answer, cut to
    128 tokens; category: the work dir's name)."""
    from pathlib import Path

    if not path.endswith(".jsonl"):
        return json.load(open(path))[:limit]
    out = []
    for line in open(path):
        r = json.loads(line)
        if r.get("answer"):
            out.append({"category": Path(path).parent.name, "prompt": r["ids"],
                        "output": r["answer"][:128]})
    return out[:limit]


def corpus_table(path: str):
    """The n-gram table of a corpus folder, or of the answers in a training answers.jsonl."""
    from edgespec.heads.corpus import NgramTable, load_corpus

    if path.endswith(".jsonl"):
        return NgramTable([np.array(r["output"]) for r in read_records(path)])
    return load_corpus(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", help="--record's json, or a training work dir's answers.jsonl")
    ap.add_argument("--record", action="store_true", help="run the demo model and write RECORDS")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--bound", action="store_true", help="replay the clairvoyant lookup instead")
    ap.add_argument("--corpus", default=None,
                    help="replay the corpus drafter with this corpus folder or answers.jsonl "
                         "(never the one replayed)")
    args = ap.parse_args()
    if args.record:
        record(args.records, args.limit)
        return
    from edgespec.drafters.lookup import PromptLookupDrafter

    records = read_records(args.records, args.limit)
    make = PromptLookupDrafter
    if args.corpus is not None:
        from edgespec.drafters.corpus import CorpusDrafter
        from edgespec.targets.cost import CostCurve

        table, curve = corpus_table(args.corpus), CostCurve(tuple(COST_MS), tuple(COST_MS.values()))
        make = lambda: CorpusDrafter(table, curve)  # noqa: E731
    rows = clairvoyant(records) if args.bound else simulate(records, make)
    for name, row in rows.items():
        print(f"{name:12s} tau {row['tau']:.2f}  est. speedup {row['est_speedup']:.2f}x")


if __name__ == "__main__":
    main()
