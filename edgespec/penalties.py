"""Repetition penalties as a :class:`~edgespec.rules.Rule`, each tree node penalised from its own
history.

Definitions (the request's ``SamplingConfig``), applied to the target's raw logits in this order
(vLLM's), before temperature and truncation:

- ``repetition_penalty`` r (an extension; the HF / llama.cpp definition): every token that
  occurs in the prompt or the generated tokens has its logit ``l`` replaced by ``l / r`` when
  ``l > 0``, else by ``l * r``. 1 is off.
- ``frequency_penalty`` f and ``presence_penalty`` a (OpenAI's): over the *generated* tokens
  only, with ``c[t]`` the number of times ``t`` was generated,
  ``l[t] <- l[t] - c[t] * f - (c[t] > 0) * a``. 0 is off.

Node ``u`` of a draft tree is penalised from the committed tokens followed by the drafted tokens
on the path to ``u`` (the rule's contract), so a drafted continuation is scored exactly as plain
decoding would score it once those tokens are committed: greedy output is unchanged by
speculation and sampled output follows the penalised distribution.

The work is over the few columns that carry a penalty (tokens seen so far or in the tree): the
rows are gathered, changed and put back, never rebuilt over the whole vocabulary.
"""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import numpy as np

from .config import SamplingConfig
from .rules import Rule
from .tree import DraftTree


def penalties_for(cfg: SamplingConfig) -> Penalties | None:
    """The rule of ``cfg``'s penalties, or None when all are off."""
    off = (cfg.frequency_penalty, cfg.presence_penalty, cfg.repetition_penalty) == (0.0, 0.0, 1.0)
    if off:
        return None
    return Penalties(cfg.frequency_penalty, cfg.presence_penalty, cfg.repetition_penalty)


class Penalties(Rule):
    """Frequency, presence and repetition penalties (see the module docstring)."""

    name = "penalties"

    def __init__(self, frequency: float = 0.0, presence: float = 0.0, repetition: float = 1.0):
        self.frequency, self.presence, self.repetition = frequency, presence, repetition
        self.prompt: set[int] = set()
        self.counts: Counter = Counter()  # generated token -> times committed

    def reset(self, prompt: list[int]) -> None:
        self.prompt = set(int(t) for t in prompt) if self.repetition != 1.0 else set()
        self.counts = Counter()

    def commit(self, tokens: list[int]) -> None:
        self.counts.update(int(t) for t in tokens)

    def apply(self, tree: DraftTree, logits: mx.array) -> mx.array:
        cols = sorted(self.prompt | set(self.counts) | set(int(t) for t in tree.tokens[1:]))
        if not cols:
            return logits
        where = {t: j for j, t in enumerate(cols)}
        counts = np.zeros((len(tree), len(cols)), dtype=np.float32)  # generated, per node
        counts[:] = [self.counts.get(t, 0) for t in cols]
        for u in range(1, len(tree)):  # a node's path: its parent's plus its own token
            counts[u] = counts[tree.parents[u]]
            counts[u, where[int(tree.tokens[u])]] += 1
        idx = mx.broadcast_to(mx.array(cols, dtype=mx.int32)[None], counts.shape)
        x = mx.take_along_axis(logits, idx, axis=-1).astype(mx.float32)
        c = mx.array(counts)
        if self.repetition != 1.0:
            seen = mx.array(np.array([t in self.prompt for t in cols]))[None] | (c > 0)
            r = self.repetition
            x = mx.where(seen, mx.where(x > 0, x / r, x * r), x)
        x = x - c * self.frequency - (c > 0).astype(mx.float32) * self.presence
        return mx.put_along_axis(logits, idx, x.astype(logits.dtype), axis=-1)
