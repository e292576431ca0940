"""Log-probabilities of the emitted tokens, from the target's rows of the verified path.

Which distribution: the target model's own next-token distribution at each emitted position,
``log_softmax`` of its raw logits, before any rule (penalties, grammar masks), temperature or
truncation (top-k, top-p, min-p): vLLM's default (``raw_logprobs``). So the values describe the
model, not the sampler: they are the same at every temperature, and a token a grammar forced
still shows how likely the model found it.

Where they come from: row ``path[i]`` of the verification forward is the target's distribution
after the ``i``-th committed position of the step, and ``tokens[i]`` the token committed there
(the accepted drafts, then the bonus). The rows are the verifier's, never a drafter's, so
speculative and plain decoding report the same values for the same tokens (up to the float
rounding of scoring a tree rather than one token: ``tests/test_logprobs.py`` allows 1e-4).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .errors import ConfigError

MAX_TOP = 20
"""The most alternatives a position reports (OpenAI's limit for ``top_logprobs``)."""


def check_top(top, name: str = "logprobs") -> int | None:
    """``top`` if it is None or an integer in [0, MAX_TOP]; else a ConfigError naming ``name``."""
    if top is None or (isinstance(top, int) and not isinstance(top, bool) and 0 <= top <= MAX_TOP):
        return top
    raise ConfigError(f"{name} must be an integer in [0, {MAX_TOP}] (the likeliest alternatives "
                      f"reported per token) or None, got {top!r}")


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token: its id, its log-probability and the ``top`` most likely tokens at its
    position as (id, log-probability), most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(rows: mx.array, tokens: list[int], top: int) -> list[TokenLogprob]:
    """``tokens[i]``'s log-probability under row ``i`` of ``rows`` (n, V raw logits), with the
    ``top`` (0..MAX_TOP) likeliest tokens of each row. Computed on the host with numpy: the
    verifier has evaluated the rows already, and numpy was the cheaper of the two on a few rows
    of a large vocabulary (see docs/measurements.md)."""
    x = np.array(rows.astype(mx.float32))
    m = x.max(-1, keepdims=True)
    lse = m + np.log(np.exp(x - m).sum(-1, keepdims=True))  # (n, 1)
    out = []
    for i, t in enumerate(tokens):
        alts: tuple = ()
        if top > 0:
            k = min(top, x.shape[-1])
            best = np.argpartition(-x[i], k - 1)[:k]
            best = best[np.argsort(-x[i, best], kind="stable")]
            alts = tuple((int(b), float(x[i, b] - lse[i, 0])) for b in best)
        out.append(TokenLogprob(int(t), float(x[i, t] - lse[i, 0]), alts))
    return out
