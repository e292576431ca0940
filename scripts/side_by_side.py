"""What ``vs_mlx_lm.py`` and ``vs_llama_cpp.py`` share: edgespec's greedy engines, the per-prompt
runs beside a reference decoder (warm-up first, prefill timed, the same prompt ids for all) and
the table of medians. Imported by those scripts (it sits beside them on ``sys.path``).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from edgespec.config import SamplingConfig
from edgespec.drafters.registry import make_drafter
from edgespec.engine import Engine
from edgespec.options import spec_for
from edgespec.prompt import encode_prompt

EVAL = Path(__file__).resolve().parents[1].parent / "shared" / "eval" / "mt_bench.jsonl"
WARMUP_TOKENS = 16

# (prompt ids, max new tokens) -> (new token ids, seconds)
Run = Callable[[list[int], int], tuple[list[int], float]]


def greedy_engine(target, method: str) -> Engine:
    """An engine for ``method`` that starts every prompt from scratch (no prefix reuse)."""
    greedy = SamplingConfig()
    return Engine(target, make_drafter(spec_for(method, {}), target, greedy), greedy,
                  reuse_prefix=False)


def engine_run(engine: Engine) -> Run:
    def run(ids: list[int], max_tokens: int) -> tuple[list[int], float]:
        t = time.perf_counter()
        tokens = engine.generate(ids, max_tokens=max_tokens).token_ids
        return tokens, time.perf_counter() - t
    return run


def compare(reference: str, runs: dict[str, Run], tokenizer, prompts, max_tokens: int) -> list[dict]:
    """Per prompt, every decoder in ``runs`` in turn (``reference`` first): a row of
    name -> (tokens/s, same tokens as the reference)."""
    warm = encode_prompt(tokenizer, [{"role": "user", "content": prompts[0].text}])
    for run in runs.values():
        run(warm, WARMUP_TOKENS)
    rows = []
    for p in tqdm(prompts, desc="prompts", unit="prompt", file=sys.stderr):
        ids = encode_prompt(tokenizer, [{"role": "user", "content": p.text}])
        ref, secs = runs[reference](ids, max_tokens)
        row = {reference: (len(ref) / secs, True)}
        for name, run in runs.items():
            if name != reference:
                got, secs = run(ids, max_tokens)
                row[name] = (len(got) / secs, got == ref)
        rows.append(row)
    return rows


def print_table(rows: list[dict], reference: str) -> None:
    print(f"| decoder | tok/s (median) | × {reference} (median per prompt) | "
          f"same tokens as {reference} |")
    print("|---|---:|---:|---:|")
    for name in rows[0]:
        tps = [r[name][0] for r in rows]
        ratio = [r[name][0] / r[reference][0] for r in rows]
        same = sum(r[name][1] for r in rows)
        print(f"| {name} | {statistics.median(tps):.1f} | {statistics.median(ratio):.2f}× | "
              f"{same}/{len(rows)} |")
