"""Figures for `edgespec serve`: endpoint overhead and second-turn time to first token.

    python scripts/server_figures.py [--model demo] [--prompts 3] [--rounds 2] [--max-tokens 24]

1. Throughput, method none, greedy: the same chat prompts (first turns of MT-bench questions) run
   in this process (Engine.stream) and through a server in a subprocess (streamed, raw SSE over
   httpx), interleaved prompt by prompt so machine noise lands on both. Decode tokens/s is
   (tokens - 1) / (last token time - first token time) on both sides, so prefill is excluded
   alike; end-to-end tokens/s counts from the request (or the call) to the last token. The
   engine's own decode tokens/s (Stats.tokens_per_s; usage.speculative.tokens_per_s from the
   server) tells a slower engine apart from slower delivery.
2. Second-turn TTFT: for each question, turn 1 (the first question, a short reply) then turn 2
   (history + the second question, max_tokens 4), on a server with prefix reuse and on one
   started with --no-prefix-reuse, both running, conversations alternating between them.
   TTFT = request sent -> first chunk with content.

In-process and endpoint runs alternate (their order flips each round); medians over prompts x
rounds. The machine is shared, so repeat the run and compare medians. Prints markdown tables and
writes --json if given.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
from edgespec import Engine, load_target

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT.parent / "shared" / "eval" / "mt_bench.jsonl"
_SERVE = "import edgespec; from edgespec.server.cli import serve; serve()"


def start_server(model: str, *extra: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", _SERVE, "--model", model, "--port", "0", *extra],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = proc.stdout.readline()
    match = re.search(r"(http://\S+/v1)", line)
    if not match:
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}")
    return proc, match.group(1)


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(2)
    proc.wait(30)


_HTTP = httpx.Client(timeout=600)  # one client, kept alive, as an editor or the openai client does


def stream_chat(url: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed request; client-side timings and the usage chunk."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "method": "none"}
    t0 = time.perf_counter()
    first = last = None
    text, usage = [], None
    with _HTTP.stream("POST", url + "/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):  # (the opening role-only chunk is skipped)
                if choice["delta"].get("content") or choice["finish_reason"]:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text.append(choice["delta"].get("content") or "")
    return {"t0": t0, "first": first, "last": last, "text": "".join(text), "usage": usage}


def in_process(engine: Engine, messages: list[dict], max_tokens: int) -> dict:
    t0 = time.perf_counter()
    first = last = None
    for step in engine.stream(messages, max_tokens=max_tokens):
        if step.token_ids:
            now = time.perf_counter()
            first = first or now
            last = now
    return {"t0": t0, "first": first, "last": last, "n": engine.last_stats.generated_tokens,
            "engine_tok_s": engine.last_stats.tokens_per_s}


def rates(r: dict, n: int, engine_tok_s: float) -> tuple[float, float, float]:
    decode = (n - 1) / (r["last"] - r["first"]) if n > 1 and r["last"] > r["first"] else float("nan")
    return decode, n / (r["last"] - r["t0"]), engine_tok_s


def throughput(url: str, engine: Engine, questions: list[list[str]], rounds: int, max_tokens: int) -> dict:
    rows = {"in_process": [], "endpoint": []}

    def local(messages):
        a = in_process(engine, messages, max_tokens)
        rows["in_process"].append(rates(a, a["n"], a["engine_tok_s"]))

    def remote(messages):
        b = stream_chat(url, messages, max_tokens)
        u = b["usage"]
        rows["endpoint"].append(rates(b, u["completion_tokens"], u["speculative"]["tokens_per_s"]))

    for i in range(rounds):
        for q in questions:
            messages = [{"role": "user", "content": q[0]}]
            for run in ((local, remote) if i % 2 == 0 else (remote, local)):  # alternate the order
                run(messages)
    return {k: {"decode_tok_s": statistics.median(r[0] for r in v),
                "end_to_end_tok_s": statistics.median(r[1] for r in v),
                "engine_reported_tok_s": statistics.median(r[2] for r in v), "runs": len(v)}
            for k, v in rows.items()}


def second_turn_ttft(urls: dict[str, str], questions: list[list[str]], rounds: int,
                     turn1_tokens: int) -> dict:
    """Conversations interleaved across the servers in ``urls`` (label -> base URL)."""
    raw = {label: {"ttft": [], "prompt": [], "cached": []} for label in urls}
    for _ in range(rounds):
        for q in questions:
            for label, url in urls.items():
                history = [{"role": "user", "content": q[0]}]
                reply = stream_chat(url, history, turn1_tokens)["text"]
                history += [{"role": "assistant", "content": reply}, {"role": "user", "content": q[1]}]
                r = stream_chat(url, history, 4)
                raw[label]["ttft"].append(r["first"] - r["t0"])
                raw[label]["prompt"].append(r["usage"]["prompt_tokens"])
                raw[label]["cached"].append(r["usage"]["prompt_tokens_details"]["cached_tokens"])
    return {label: {"ttft_s": statistics.median(v["ttft"]), "prompt_tokens": statistics.median(v["prompt"]),
                    "cached_tokens": statistics.median(v["cached"]), "runs": len(v["ttft"])}
            for label, v in raw.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--turn1-tokens", type=int, default=24)
    ap.add_argument("--skip-ttft", action="store_true", help="only the throughput comparison")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    lines = PROMPTS.read_text().splitlines()
    questions = [json.loads(x)["turns"] for x in lines[:: max(1, len(lines) // args.prompts)]][: args.prompts]

    engine = Engine(load_target(args.model, progress=False))
    servers = {"prefix reuse": start_server(args.model)}
    if not args.skip_ttft:
        servers["--no-prefix-reuse"] = start_server(args.model, "--no-prefix-reuse")
    try:
        tp = throughput(servers["prefix reuse"][1], engine, questions, args.rounds, args.max_tokens)
        turns = {} if args.skip_ttft else second_turn_ttft(
            {k: url for k, (_, url) in servers.items()}, questions, args.rounds, args.turn1_tokens)
    finally:
        for proc, _ in servers.values():
            stop_server(proc)
    report = {"model": args.model, "prompts": args.prompts, "rounds": args.rounds,
              "max_tokens": args.max_tokens, "throughput": tp, "second_turn": turns}
    ip, ep = tp["in_process"], tp["endpoint"]
    print(f"| {args.model}, method none, greedy | in-process | endpoint | endpoint / in-process |")
    print("| --- | --- | --- | --- |")
    for key, label in (("decode_tok_s", "decode tok/s (client clock)"),
                       ("engine_reported_tok_s", "decode tok/s (engine's own stats)"),
                       ("end_to_end_tok_s", "end-to-end tok/s")):
        print(f"| {label} | {ip[key]:.2f} | {ep[key]:.2f} | {ep[key] / ip[key]:.3f} |")
    if turns:
        print()
        print("| second turn | prompt tokens | cached tokens | TTFT s |")
        print("| --- | --- | --- | --- |")
        for label, r in turns.items():
            print(f"| {label} | {r['prompt_tokens']:.0f} | {r['cached_tokens']:.0f} | {r['ttft_s']:.3f} |")
        reuse, fresh = turns["prefix reuse"], turns["--no-prefix-reuse"]
        print(f"\nTTFT speedup from prefix reuse: {fresh['ttft_s'] / reuse['ttft_s']:.2f}x "
              f"(medians over {reuse['runs']} conversations each)")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
