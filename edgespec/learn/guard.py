"""The guard: a new head replaces the one in use only if it accepts more on the user's own
recent history, replayed through the real verify path in the same run.

Contract: ``compare(target, old, new, held, max_tokens, min_gain)`` replays each held-out record's
prompt (its token ids, as the user sent them) greedily with an EAGLE-3 drafter on each head
folder (a fixed tree of ``NODES`` nodes a step, below), the two interleaved prompt by prompt (the order alternating, so drift in the machine's
speed lands on both), each up to the record's answer length or ``max_tokens``. It reports τ
(tokens per target forward: what a head changes), tokens/s (what the user feels, noisier) and
whether both produced the same tokens (they must: greedy decoding is lossless whatever drafts).
The decision is on τ: the new head wins when its τ is at least ``1 + min_gain`` times the old
one's. Speed is reported, not decided on: a replay of a few dozen prompts on a busy machine moves
tokens/s by more than a head does.
"""

from __future__ import annotations

import time

from ..config import SamplingConfig
from ..drafters import make_drafter
from ..engine import Engine
from ..options import spec_for
from .store import Record

MIN_GAIN = 0.01
NODES = 8
"""Each step verifies a fixed tree of this many drafted nodes: an adaptive tree's size follows
the drafting time measured on the fly, which moves τ with the machine's load; a fixed one makes
τ a property of the head alone."""


def _run(target, head, prompt: list[int], max_tokens: int):
    spec = spec_for("eagle3", {"head": str(head), "adaptive": False, "num_draft": NODES})
    drafter = make_drafter(spec, target, SamplingConfig())
    engine = Engine(target, drafter, SamplingConfig(), reuse_prefix=False)
    return engine.generate(prompt, max_tokens=max_tokens)


def compare(target, old, new, held: list[Record], max_tokens: int = 128,
            min_gain: float = MIN_GAIN, progress=None, stop=lambda: False) -> dict | None:
    """The guard's numbers and decision (see the module doc); None when ``stop()`` became true
    between two prompts (learning was paused: the guard runs again whole next time)."""
    totals = {"old": [0, 0, 0.0], "new": [0, 0, 0.0]}  # tokens, forwards, decode seconds
    same = 0
    t0 = time.perf_counter()
    for i, rec in enumerate(held):
        if stop():
            return None
        prompt = list(rec.meta["prompt_ids"])
        n = max(1, min(rec.answer_tokens, max_tokens))
        out = {}
        for which in (("old", "new") if i % 2 == 0 else ("new", "old")):
            r = _run(target, old if which == "old" else new, prompt, n)
            t = totals[which]
            t[0], t[1], t[2] = t[0] + r.stats.generated_tokens, t[1] + r.stats.target_forwards, \
                t[2] + r.stats.decode_s
            out[which] = r.token_ids
        same += out["old"] == out["new"]
        if progress is not None:
            progress(i + 1, len(held))

    def summary(t):
        return {"tokens": t[0], "forwards": t[1],
                "tau": round(t[0] / t[1], 4) if t[1] else 0.0,
                "tokens_per_s": round(t[0] / t[2], 1) if t[2] else None}

    old_s, new_s = summary(totals["old"]), summary(totals["new"])
    wins = bool(held) and new_s["tau"] >= old_s["tau"] * (1 + min_gain) and same == len(held)
    gain = new_s["tau"] / old_s["tau"] - 1 if old_s["tau"] else 0.0
    if not held:
        why = "no held-out history to judge on"
    elif same != len(held):
        why = f"outputs differed on {len(held) - same} of {len(held)} prompts (must not happen)"
    else:
        why = (f"new τ {new_s['tau']:.3f} vs old {old_s['tau']:.3f} ({gain:+.1%}) on "
               f"{len(held)} held-out prompts from this user's recent history; "
               f"{'replaces' if wins else 'needs'} {'it' if wins else f'>= {min_gain:+.0%}'}")
    return {"prompts": len(held), "old": old_s, "new": new_s, "tau_gain": round(gain, 4),
            "identical_outputs": same, "min_gain": min_gain, "wins": wins, "decision": why,
            "seconds": round(time.perf_counter() - t0, 1)}
