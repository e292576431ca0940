"""What do penalties and logprobs cost per token, and does speculation stay lossless under them?

Usage: python scripts/rules_cost.py [MODEL] [ROUNDS] [MAX_TOKENS] [METHODS] — greedy chat
prompts, each generated under every setting below by every method (comma-separated, default
``none,lookup``), interleaved per prompt in a rotating order so drift on a shared machine
touches them alike. Settings: ``base`` (nothing), ``logprobs`` (``logprobs=5``), ``penalties``
(frequency 0.5, presence 0.3, repetition 1.1). Checks, per prompt and setting, that every
method's tokens (and logprobs, within 1e-4) equal plain decoding's, and prints per setting and
method the median ms per token and the speedup over plain decoding under the same setting.
(``none`` runs the pipelined plain loop under ``base`` and ``logprobs``, the step loop under
``penalties``.)
"""

from __future__ import annotations

import statistics
import sys
import time

import edgespec
from edgespec import Engine, SamplingConfig, SpecConfig, load_target, make_drafter

PROMPTS = ["Give me three tips for sleeping well.", "What is the capital of France?",
           "Write a haiku about autumn.", "Explain what a hash map is in two sentences.",
           "Name three colours and their complements.", "List the days of the week."]
SETTINGS = {"base": ({}, None), "logprobs": ({}, 5),
            "penalties": ({"frequency_penalty": 0.5, "presence_penalty": 0.3,
                           "repetition_penalty": 1.1}, None)}


def main(ref: str = "demo", rounds: str = "2", max_tokens: str = "64",
         methods: str = "none,lookup") -> None:
    target = load_target(ref)
    names = methods.split(",")
    assert names[0] == "none", "the first method must be none (the reference)"
    ms: dict = {(s, m): [] for s in SETTINGS for m in names}
    order = [(s, m) for s in SETTINGS for m in names]
    for r in range(int(rounds)):
        for i, prompt in enumerate(PROMPTS):
            messages = [{"role": "user", "content": prompt}]
            ref_out = {}
            k = (r * len(PROMPTS) + i) % len(order)
            for s, m in order[k:] + order[:k]:
                kw, top = SETTINGS[s]
                cfg = SamplingConfig(**kw)
                engine = Engine(target, make_drafter(SpecConfig(method=m), target, cfg), cfg,
                                reuse_prefix=False)
                t0 = time.perf_counter()
                res = engine.generate(messages, max_tokens=int(max_tokens), logprobs=top)
                ms[s, m].append((time.perf_counter() - t0) * 1e3 / max(len(res.token_ids), 1))
                ref_out.setdefault(s, {})[m] = res
            for s in SETTINGS:
                want = ref_out[s]["none"]
                for m in names[1:]:
                    got = ref_out[s][m]
                    assert got.token_ids == want.token_ids, (prompt, s, m)
                    if want.logprobs is not None:
                        diff = max(abs(a.logprob - b.logprob)
                                   for a, b in zip(got.logprobs, want.logprobs))
                        assert diff < 1e-4, (prompt, s, m, diff)
    print(f"edgespec {edgespec.__version__}, model {target.name}, {rounds} rounds x "
          f"{len(PROMPTS)} prompts, {max_tokens} tokens, greedy; outputs identical to plain")
    print(f"{'setting':<10} {'method':<10} {'ms/token':>9} {'vs plain':>9} {'vs base':>8}")
    for s in SETTINGS:
        for m in names:
            med = statistics.median(ms[s, m])
            plain = statistics.median(ms[s, "none"])
            base = statistics.median(ms["base", m])
            print(f"{s:<10} {m:<10} {med:9.2f} {plain / med:8.2f}x {med / base:7.2f}x")


if __name__ == "__main__":
    main(*sys.argv[1:])
