"""Replay the prediction drafter against recorded greedy answers, timed by the cost curve.

Generates (once, cached in --answers) the demo model's plain greedy answers to the edits
workload, then replays ``prediction.with_prediction``'s drafter for a method against them: each
step's proposal is verified against the recorded answer (what greedy verification does), and
its time estimated as this device's verify-cost curve at the tree's size. Reports per row and
overall: forwards, kept/rejected prediction tokens and the estimated speedup against plain
decoding (one 1-node forward per token). Load-independent, for choosing the drafter's settings;
``edgespec bench`` measures the real thing.

    .venv/bin/python scripts/prediction_sim.py [--method lookup] [--answers /tmp/edits_answers.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgespec import Engine, load_target
from edgespec.config import SpecConfig
from edgespec.drafters import make_drafter
from edgespec.prompt import encode_prediction, encode_prompt
from edgespec.targets.cost import verify_cost_curve
from edgespec.verify import Accepted


def answers(target, rows, path: Path, max_tokens: int) -> list[list[int]]:
    if path.is_file():
        return json.loads(path.read_text())
    out = []
    for r in rows:
        chat = [{"role": "user", "content": r["turns"][0]}]
        out.append(Engine(target).generate(chat, max_tokens=max_tokens).token_ids)
        print(f"answered {r['question_id']}: {len(out[-1])} tokens", flush=True)
    path.write_text(json.dumps(out))
    return out


def replay(drafter, prompt: list[int], answer: list[int], ms) -> tuple[int, float]:
    """(forwards, estimated ms) for ``drafter`` against a target that greedily says ``answer``."""
    drafter.prefill(prompt, None, None)
    done = forwards = 0
    t = 0.0
    seq = prompt + answer
    while done < len(answer):
        tree = drafter.propose(len(answer) - done - 1)
        path, u = [0], 0
        while True:
            nxt = [c for c in tree.children(u) if done + len(path) - 1 < len(answer)
                   and tree.tokens[c] == answer[done + len(path) - 1]]
            if not nxt:
                break
            u = nxt[0]
            path.append(u)
        acc = Accepted(path, seq[len(prompt) + done : len(prompt) + done + len(path)])
        drafter.update(acc, tree, None)
        done += len(acc.tokens)
        forwards += 1
        t += ms(len(tree))
    return forwards, t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="data/workloads/edits.jsonl")
    ap.add_argument("--method", default="lookup")
    ap.add_argument("--answers", default="/tmp/edits_answers.json")
    ap.add_argument("--max-tokens", type=int, default=512)
    a = ap.parse_args()
    target = load_target("demo", progress=False)
    rows = [json.loads(line) for line in Path(a.prompts).read_text().splitlines() if line.strip()]
    said = answers(target, rows, Path(a.answers), a.max_tokens)
    curve = verify_cost_curve(target)
    plain_ms = spec_ms = 0.0
    kept = rejected = 0
    for r, answer in zip(rows, said):
        prompt = encode_prompt(target.tokenizer, [{"role": "user", "content": r["turns"][0]}])
        d = make_drafter(SpecConfig(method=a.method), target,
                         prediction=encode_prediction(target.tokenizer, r["prediction"]))
        forwards, ms = replay(d, prompt, answer, curve.ms)
        k, rj = d.prediction_tokens()
        kept, rejected = kept + k, rejected + rj
        base = len(answer) * curve.ms(1)
        plain_ms, spec_ms = plain_ms + base, spec_ms + ms
        print(f"{r['question_id']}: {len(answer)} tokens, {forwards} forwards, prediction "
              f"{k}/{rj}, est. {base / ms:.2f}x")
    print(f"overall ({a.method}): est. {plain_ms / spec_ms:.2f}x, prediction kept {kept}, "
          f"rejected {rejected}")


if __name__ == "__main__":
    main()
