"""What recording for learning costs a decoding, and what it stores.

Runs each prompt with and without a recorder (the same engine path; the order alternates per
prompt, so drift lands on both), greedy, and reports the wall time of whole generations
(prefill, decoding and the recorder's host copies; the writer thread's disk writes run beside
them on the same cores), decode time alone, whether the outputs are identical, and the record
store's bytes per 1,000 recorded rows and per 1,000 answer tokens.

    .venv/bin/python scripts/learn_overhead.py --prompts ../shared/eval/mt_bench.jsonl \\
        --limit 24 --max-tokens 128 --methods none,eagle3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--methods", default="none,eagle3")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    os.environ["EDGESPEC_LEARN_DIR"] = tempfile.mkdtemp(prefix="learn-overhead-")

    from tqdm import tqdm

    from edgespec.bench import load_prompts
    from edgespec.config import SamplingConfig
    from edgespec.drafters import make_drafter
    from edgespec.engine import Engine
    from edgespec.learn.recorder import Recorder
    from edgespec.learn.session import aux_layers, record_store
    from edgespec.options import spec_for
    from edgespec.targets import load

    target = load(a.model, dtype=a.dtype, progress=False)
    prompts = load_prompts(a.prompts, a.limit)
    store = record_store(target, budget_mb=1 << 20)
    recorder = Recorder(store, aux_layers(target), "measure")
    sampling = SamplingConfig()
    out = {}
    for method in a.methods.split(","):
        engines = {on: Engine(target, make_drafter(spec_for(method, {}), target, sampling),
                              sampling, reuse_prefix=False, recorder=recorder if on else None)
                   for on in (False, True)}
        for on in (False, True):  # warm-up
            engines[on].generate([{"role": "user", "content": prompts[0].text}], max_tokens=16)
        recorder.flush()
        store.remove(r.name for r in store.records())
        sums = {on: [0.0, 0.0, 0] for on in (False, True)}
        same = 0
        for i, p in enumerate(tqdm(prompts, desc=method)):
            ids = {}
            for on in ((False, True) if i % 2 == 0 else (True, False)):
                t0 = time.perf_counter()
                r = engines[on].generate([{"role": "user", "content": p.text}],
                                         max_tokens=a.max_tokens)
                s = sums[on]
                s[0] += time.perf_counter() - t0
                s[1] += r.stats.decode_s
                s[2] += r.stats.generated_tokens
                ids[on] = r.token_ids
            same += ids[False] == ids[True]
        recorder.flush()
        recs = store.records()
        rows, size = sum(r.rows for r in recs), sum(r.bytes for r in recs)
        answer = sum(r.answer_tokens for r in recs)
        off, on = sums[False], sums[True]
        out[method] = {
            "prompts": len(prompts), "identical": same, "tokens": on[2],
            "wall_s_off": round(off[0], 2), "wall_s_on": round(on[0], 2),
            "wall_overhead": round(on[0] / off[0] - 1, 4),
            "decode_s_off": round(off[1], 2), "decode_s_on": round(on[1], 2),
            "decode_overhead": round(on[1] / off[1] - 1, 4),
            "records": len(recs), "rows": rows, "answer_tokens": answer, "bytes": size,
            "bytes_per_1000_rows": round(1000 * size / rows) if rows else None,
            "bytes_per_1000_answer_tokens": round(1000 * size / answer) if answer else None}
        print(json.dumps({method: out[method]}, indent=1), flush=True)
    recorder.close()
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
