"""What the chat's sampling defaults cost in speed: the demo model with its default method
against plain decoding, greedy and under the candidate sampling settings.

A repetition penalty changes the target's distribution but not the drafter's, so it can lower
acceptance; this measures by how much. The prompts are this script's own (not an evaluation
set). Every setting runs the same prompts and seeds, plain decoding first as the baseline.

Usage: python scripts/chat_defaults_speed.py [--method eagle3] [--seeds 2] [--max-tokens 128]
       [--only NAME ...]
Prints one row per setting: plain tok/s, the method's tok/s, speedup, τ and acceptance.
"""

from __future__ import annotations

import argparse

from edgespec import Engine, load_target, make_drafter
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.drafters.default import interactive_method
from edgespec.stats import Stats

PROMPTS = (
    "Can you write a haiku?",
    "Explain how a bicycle stays upright.",
    "Give me three tips for learning to cook.",
    "What is the difference between weather and climate?",
    "Write a short story about a lighthouse keeper.",
    "How do I make a cup of tea?",
)
SETTINGS = {
    "greedy": dict(temperature=0.0),
    "T0.7 p0.9": dict(temperature=0.7, top_p=0.9),
    "T0.7 p0.9 rep1.1 (chat)": dict(temperature=0.7, top_p=0.9, repetition_penalty=1.1),
    "T0.2 p0.9": dict(temperature=0.2, top_p=0.9),
    "T0.2 p0.9 rep1.1": dict(temperature=0.2, top_p=0.9, repetition_penalty=1.1),
    "T0.7 p0.9 rep1.05": dict(temperature=0.7, top_p=0.9, repetition_penalty=1.05),
    "T0.7 p0.9 freq0.5": dict(temperature=0.7, top_p=0.9, frequency_penalty=0.5),
    "T0.2 p0.9 rep1.05": dict(temperature=0.2, top_p=0.9, repetition_penalty=1.05),
}


def run(target, method: str, kw: dict, seeds, generation) -> Stats:
    total = Stats(method=method)
    for seed in seeds:
        sampling = SamplingConfig(seed=seed, **kw)
        engine = Engine(target, make_drafter(SpecConfig(method=method), target, sampling),
                        sampling, reuse_prefix=False)
        for prompt in PROMPTS:
            s = engine.generate([{"role": "user", "content": prompt}], generation=generation).stats
            for name in ("generated_tokens", "target_forwards", "proposed", "accepted"):
                setattr(total, name, getattr(total, name) + getattr(s, name))
            total.decode_s += s.decode_s
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", default=None, help="default: the chat's default for the demo")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--only", nargs="*", default=None, help="run only these settings (names)")
    args = ap.parse_args()
    target = load_target("demo")
    method = args.method or interactive_method(None, target)
    generation = GenerationConfig(max_tokens=args.max_tokens)
    run(target, method, SETTINGS["greedy"], [0], GenerationConfig(max_tokens=8))  # warm-up
    for name, kw in SETTINGS.items():
        if args.only and name not in args.only:
            continue
        seeds = [0] if kw["temperature"] == 0 else range(args.seeds)
        plain, spec = run(target, "none", kw, seeds, generation), run(target, method, kw, seeds,
                                                                     generation)
        speedup = spec.tokens_per_s / plain.tokens_per_s
        print(f"{name:26s} plain {plain.tokens_per_s:6.1f} tok/s  {method} "
              f"{spec.tokens_per_s:6.1f} tok/s  speedup {speedup:4.2f}x"
              f"  τ {spec.tau:4.2f}  accepted {spec.acceptance_rate:4.0%}", flush=True)


if __name__ == "__main__":
    main()
