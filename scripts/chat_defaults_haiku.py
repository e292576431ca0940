"""How the demo model answers short poem requests under candidate chat sampling defaults.

For each setting, seeded answers to each prompt (plain decoding: speculation does not change the
output distribution) and, per answer, how often its most repeated line or clause (split at new
lines and commas) occurs: the failure the chat's defaults must avoid is one line repeated until
the token limit (greedy does this on the demo for "Can you write a haiku?").

Usage: python scripts/chat_defaults_haiku.py [--seeds 4] [--max-tokens 256] [--only NAME ...]
Prints one row per setting: the largest and mean repeat count over all answers, how many
answers ran to the token limit, and the answer to the haiku question with the first seed.
"""

from __future__ import annotations

import argparse
from collections import Counter

from edgespec import Engine, load_target
from edgespec.config import GenerationConfig, SamplingConfig

HAIKU = "Can you write a haiku?"
PROMPTS = (HAIKU, "write me a haiku", "Write a haiku about autumn.",
           "Write a short poem about rain.")
SETTINGS = {
    "greedy": dict(temperature=0.0),
    "greedy rep1.1": dict(temperature=0.0, repetition_penalty=1.1),
    "T0.7 p0.9": dict(temperature=0.7, top_p=0.9),
    "T0.7 p0.9 rep1.1": dict(temperature=0.7, top_p=0.9, repetition_penalty=1.1),
    "T0.2 p0.9 (model card)": dict(temperature=0.2, top_p=0.9),
    "T0.2 p0.9 rep1.1": dict(temperature=0.2, top_p=0.9, repetition_penalty=1.1),
    "T0.7 p0.9 rep1.05": dict(temperature=0.7, top_p=0.9, repetition_penalty=1.05),
    "T0.7 p0.9 freq0.5": dict(temperature=0.7, top_p=0.9, frequency_penalty=0.5),
    "T0.2 p0.9 rep1.05": dict(temperature=0.2, top_p=0.9, repetition_penalty=1.05),
}


def max_repeat(text: str) -> int:
    parts = [p.strip() for line in text.splitlines() for p in line.split(",") if p.strip()]
    return max(Counter(parts).values()) if parts else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--only", nargs="*", default=None, help="run only these settings (names)")
    args = ap.parse_args()
    engine = Engine(load_target("demo"), reuse_prefix=True)
    generation = GenerationConfig(max_tokens=args.max_tokens)
    for name, kw in SETTINGS.items():
        if args.only and name not in args.only:
            continue
        seeds = [0] if kw["temperature"] == 0 else range(args.seeds)
        repeats, at_limit, haiku = [], 0, None
        for prompt in PROMPTS:
            for seed in seeds:
                result = engine.generate([{"role": "user", "content": prompt}],
                                         generation=generation,
                                         sampling=SamplingConfig(seed=seed, **kw))
                repeats.append(max_repeat(result.text))
                at_limit += result.finish_reason == "length"
                if prompt == HAIKU and haiku is None:
                    haiku = result.text
        print(f"{name:24s} repeat max {max(repeats):3d} mean {sum(repeats) / len(repeats):5.2f}  "
              f"at the token limit {at_limit}/{len(repeats)}  haiku: {haiku[:200]!r}", flush=True)


if __name__ == "__main__":
    main()
