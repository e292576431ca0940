"""What does the Python API cost per token over driving ``Engine.generate`` directly?

Usage: python scripts/api_overhead.py [MODEL] [ROUNDS] [METHOD] — the same chat prompts, greedy,
``MAX_TOKENS`` tokens each, through ``LLM.chat`` (its generation thread, queue, events), through
``LLM.stream`` (a step at a time) and through ``Engine.generate`` on this thread, over the same
loaded weights. The three are interleaved per prompt, in a rotating order, so drift on a shared
machine touches them alike; the output must be identical. Prints the median wall time per token
of each and, per API path, the median and quartiles of its time over the engine's on the same
prompt in the same round (1.000 = no overhead). Run it on a quiet machine.
"""

from __future__ import annotations

import statistics
import sys
import time

import edgespec

PROMPTS = ["Give me three tips for sleeping well.", "What is the capital of France?",
           "Write a haiku about autumn.", "Explain what a hash map is in two sentences.",
           "Name three colours and their complements."]
MAX_TOKENS = 48


def main(ref: str = "demo", rounds: str = "5", method: str = "none") -> None:
    llm = edgespec.load(ref, method=method, max_tokens=MAX_TOKENS, progress=False)
    target = llm.target  # the same weights; the engine runs only while the LLM is idle
    engine = edgespec.Engine(target, edgespec.make_drafter(edgespec.SpecConfig(method=method), target))

    def via_engine(p):
        return engine.generate([{"role": "user", "content": p}], max_tokens=MAX_TOKENS)

    def via_stream(p):
        stream = llm.stream(p)
        for _ in stream:
            pass
        return stream.result()

    paths = {"engine": via_engine, "chat": llm.chat, "stream": via_stream}
    for fn in paths.values():  # warm-up: compilation, first-call costs
        fn(PROMPTS[0])
    per_token = {name: [] for name in paths}
    ratio = {name: [] for name in paths if name != "engine"}  # paired: the same prompt and round
    for r in range(int(rounds)):
        for i, p in enumerate(PROMPTS):
            names = list(paths)
            names = names[(r + i) % 3:] + names[: (r + i) % 3]  # rotate who goes first
            took, ids = {}, {}
            for name in names:
                t = time.perf_counter()
                res = paths[name](p)
                took[name] = time.perf_counter() - t
                ids[name] = res.token_ids
            assert ids["chat"] == ids["engine"] == ids["stream"], p
            n = len(ids["engine"])
            for name in paths:
                per_token[name].append(took[name] / n * 1e3)
            for name in ratio:
                ratio[name].append(took[name] / took["engine"])
    print(f"{ref}, method {method}, {len(PROMPTS)} prompts x {rounds} rounds, {MAX_TOKENS} tokens max")
    for name, values in per_token.items():
        med = statistics.median(values)
        line = f"{name:>7}: {med:7.2f} ms/token (min {min(values):.2f})"
        if name in ratio:
            q = statistics.quantiles(ratio[name], n=4)
            line += (f"; paired time / engine's: median {statistics.median(ratio[name]):.3f} "
                     f"(quartiles {q[0]:.3f}-{q[2]:.3f})")
        print(line)
    llm.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
