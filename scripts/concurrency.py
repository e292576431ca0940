"""Several clients at once: throughput and per-client latency against concurrency and the row
policy, through the worker the server and the Python API run on (no HTTP in the way).

Each configuration is one run: ``c`` closed-loop clients share the prompts (client k sends
prompts k, k + c, ... one after another, each waiting for its answer), the worker decodes up to
``c`` at once under the batch policy. Throughput is all generated tokens over the run's wall
time; a request's time per token is its wall time (submit to last event) over its tokens, and
the table gives each configuration's median of those. Every output is compared with the same
method's output from ``Engine.stream`` alone, one request after another (greedy: they must be
identical); that run's speed is also the single-request baseline (the ``engine`` rows).

    .venv/bin/python scripts/concurrency.py --prompts 16 --max-tokens 128 --json out.json

The prompts are MT-bench's (``../shared/eval/mt_bench.jsonl``: measured on, never tuned on).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

from edgespec.bench import load_prompts
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.prompt import encode_prompt
from edgespec.targets import load
from edgespec.worker import Done, Failed, GenRequest, ThreadJob, Worker, loader

EVAL = Path(__file__).resolve().parents[2] / "shared" / "eval" / "mt_bench.jsonl"


def eval_prompts(target, limit: int) -> list[list[int]]:
    """The first ``limit`` MT-bench prompts, each a user turn encoded with the chat template."""
    return [encode_prompt(target.tokenizer, [{"role": "user", "content": r.text}])
            for r in load_prompts(EVAL, limit=limit)]


def run(target, method: str, policy: str, clients: int, prompts, max_tokens: int) -> dict:
    worker = Worker(loader(target), max_concurrency=clients, batch_policy=policy).start()
    results: dict[int, dict] = {}

    def client(k: int) -> None:
        for i in range(k, len(prompts), clients):
            req = GenRequest(prompts[i], GenerationConfig(max_tokens=max_tokens), SamplingConfig(),
                             SpecConfig(method=method))
            t0 = time.perf_counter()
            job = worker.submit(ThreadJob(req))
            tokens: list[int] = []
            for event in worker.events_blocking(job):
                if isinstance(event, Failed):
                    raise event.error
                if isinstance(event, Done):
                    stats = event.stats
                    break
                tokens += event.token_ids
            wall = time.perf_counter() - t0
            results[i] = {"tokens": tokens, "wall": wall, "tau": stats.tau}

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    worker.stop()
    total = sum(len(r["tokens"]) for r in results.values())
    per_token = [r["wall"] / max(1, len(r["tokens"])) for r in results.values()]
    return {"method": method, "policy": policy, "clients": clients, "tokens": total,
            "wall_s": wall, "tok_s": total / wall,
            "median_ms_per_token": 1000 * statistics.median(per_token),
            "outputs": [results[i]["tokens"] for i in range(len(prompts))]}


def direct(target, method: str, prompts, max_tokens: int) -> dict:
    """One request after another through ``Engine.stream`` itself (no worker, no batch): the
    single-request path the batch must not slow down."""
    from edgespec.drafters import make_drafter
    from edgespec.engine import Engine

    engine = Engine(target)
    t0 = time.perf_counter()
    outputs = []
    for ids in prompts:
        engine.drafter = make_drafter(SpecConfig(method=method), target, SamplingConfig())
        outputs.append(engine.generate(ids, max_tokens=max_tokens).token_ids)
    wall = time.perf_counter() - t0
    total = sum(len(o) for o in outputs)
    return {"method": method, "policy": "engine", "clients": 1, "tokens": total, "wall_s": wall,
            "tok_s": total / wall, "median_ms_per_token": None, "outputs": outputs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--configs", default="auto:shared,auto:plain,auto:full,none:shared")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    target = load(a.model, dtype=a.dtype, progress=False)
    prompts = eval_prompts(target, a.prompts)
    clients = [int(c) for c in a.clients.split(",")]
    configs = [tuple(c.split(":")) for c in a.configs.split(",")]
    # warm-up: kernels compiled, cost curve measured or read, drafters' heads loaded
    for method in {m for m, _ in configs}:
        run(target, method, "shared", 2, prompts[:2], 8)
    out, solo = [], {}
    for method in sorted({m for m, _ in configs}):
        r = direct(target, method, prompts, a.max_tokens)
        solo[method] = r["outputs"]
        r["identical_to_solo"] = True
        r["vs_serial_auto"] = None
        out.append(r)
        print(f"{method:5} engine c=1  {r['tok_s']:7.1f} tok/s  (Engine.stream, no worker)",
              flush=True)
    for c in clients:
        for method, policy in configs:
            if c == 1 and policy != "shared":
                continue  # alone, every policy drafts the whole tree
            r = run(target, method, policy, c, prompts, a.max_tokens)
            base = solo.get(method)
            r["identical_to_solo"] = None if base is None else r["outputs"] == base
            out.append(r)
            serial = next((x for x in out if x["clients"] == 1 and x["method"] == "auto"
                           and x["policy"] == "shared"), None)
            r["vs_serial_auto"] = r["tok_s"] / serial["tok_s"] if serial else None
            print(f"{method:5} {policy:6} c={c}  {r['tok_s']:7.1f} tok/s  "
                  f"median {r['median_ms_per_token']:6.1f} ms/token  "
                  f"x serial {r['vs_serial_auto'] or 0:.2f}  identical {r['identical_to_solo']}",
                  flush=True)
    if a.json:
        for r in out:
            r.pop("outputs")
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
