"""Calibration of the self-drafts: which layers to draft through, or that none pays.

The engine verifies every draft, so any subset is lossless and a bad one costs only speed.
Calibration greedy-decodes a short chat with the target, measures each candidate's exact greedy
acceptance (``simulate_tau``) and its measured step costs, and returns the best candidate by
expected tokens/s, or ``best=None`` with a ``reason`` when none beats plain decoding by a margin
(the caller then decodes plainly). On the demo model, not trained for early exit, that is the
usual outcome (see docs/measurements.md, "the fused, compiled forward").
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..cache import KVCache
from ..errors import ConfigError
from ..targets.target import Target
from .layer_subset import LayerSubset


@dataclass
class CalibrationResult:
    """``best``: the exit layer (or layer list) to use, None when none beats plain decoding;
    ``table``: one dict per candidate; ``reason``: why ``best`` was chosen or is None."""

    best: int | list[int] | None
    table: list[dict]
    reason: str


def simulate_tau(matches: Sequence[bool], k: int) -> float:
    """Tokens per target forward of greedy chain drafting with k drafts per step.

    ``matches[t]``: the draft's argmax equals the target's for token t, both given the true
    prefix. Exact for greedy decoding: a draft is only verified when every draft before it was
    accepted, and then the draft's context is the true prefix.
    """
    t = steps = 0
    while t < len(matches):
        a = 0
        while a < k and t + a < len(matches) and matches[t + a]:
            a += 1
        t, steps = t + a + 1, steps + 1
    return len(matches) / steps if steps else 0.0


def expected_speedup(tau: float, k: int, draft_cost: float, verify_cost: float,
                     plain_cost: float) -> float:
    """Expected tokens/s over plain decoding: tau / (k·draft_cost + verify_cost) · plain_cost."""
    return tau * plain_cost / (k * draft_cost + verify_cost)


def choose_best(table: list[dict], key: str, min_speedup: float = 1.05) -> tuple:
    """(row[key] of the fastest row, reason), or (None, reason) when it is under ``min_speedup``.

    The margin covers what the cost model leaves out (per-step Python, verification, timing noise).
    """
    if not table:
        return None, "no candidates were measured"
    row = max(table, key=lambda r: r["speedup"])
    what = f"{key}={row[key]}: {row['accepted']:.0%} of drafts accepted, tau {row['tau']:.2f}"
    if row["speedup"] < min_speedup:
        return None, (f"no candidate beats plain decoding by {min_speedup}x (best {what}, "
                      f"{row['speedup']:.2f}x); decode without drafting")
    return row[key], f"best {what}, expected {row['speedup']:.2f}x plain decoding"


def _greedy_continuation(target: Target, prompt_ids: list[int], n: int) -> list[int]:
    cache, seq, out = target.make_cache(), list(prompt_ids), []
    for _ in range(n):
        logits = target.score(seq, cache).logits[-1]
        cache.commit()
        seq = [int(mx.argmax(logits).item())]
        out.append(seq[0])
    return out


def _layer_pass(target: Target, seq: list[int], n: int) -> tuple[KVCache, list[mx.array]]:
    """One full pass over ``seq``: its committed cache and the hidden state (n, H) of the last
    n tokens entering each layer (index L: after the last layer)."""
    cache, L = target.make_cache(), target.num_layers
    out = target.score(seq, cache, capture=range(L + 1), head=False)
    cache.commit()
    hidden = [out.captured[i][-n:] for i in range(L + 1)]
    mx.eval(hidden, cache.state())
    return cache, hidden


def _step_cost(target: Target, layers: Sequence[int], cache: KVCache, n: int, reps: int = 3) -> float:
    """Seconds of one n-token step through ``layers`` + head after ``cache``'s tokens (real
    layer ids; nothing is committed): the fastest of ``reps``, the least disturbed by other load."""
    tokens = mx.zeros((n,), dtype=mx.int32)
    times = []
    for _ in range(reps + 1):  # the first run warms up
        t0 = time.perf_counter()
        mx.argmax(target.score(tokens, cache, layers=layers).logits[-1]).item()
        times.append(time.perf_counter() - t0)
    return min(times[1:])


def _base_costs(target: Target, cache: KVCache, k: int) -> tuple[float, float]:
    """(plain step, verification of k+1 tokens); k+1 tokens never cost less than one."""
    plain = _step_cost(target, range(target.num_layers), cache, 1)
    return plain, max(plain, _step_cost(target, range(target.num_layers), cache, k + 1))


CALIBRATION_CHAT = [{"role": "user", "content": "Explain in a few sentences why the sky is blue, "
                     "then list three everyday examples of light scattering."}]


def calibration_ids(target: Target, messages: list[dict] | None = None) -> list[int]:
    """Token ids of a short chat prompt for calibration (default: ``CALIBRATION_CHAT``)."""
    tok = target.tokenizer
    return tok.encode(tok.apply_chat_template(messages or CALIBRATION_CHAT), add_special_tokens=False)


def _check_prompt(prompt_ids, tokens: int) -> list[int]:
    if not prompt_ids or not all(isinstance(t, int) for t in prompt_ids):
        raise ConfigError("calibration prompt must be a non-empty list of token ids, "
                          f"got {str(prompt_ids)[:80]}")
    if not isinstance(tokens, int) or tokens < 4:
        raise ConfigError(f"calibration tokens must be an integer >= 4, got {tokens!r}")
    return list(prompt_ids)


def calibrate_exit_layer(target: Target, prompt_ids: list[int], candidates: Sequence[int] | None = None,
                         num_draft: int = 4, tokens: int = 32,
                         min_speedup: float = 1.05) -> CalibrationResult:
    """Pick the exit layer E maximising expected tokens/s, or None when none beats plain decoding.

    Greedy-decodes ``tokens`` tokens of ``prompt_ids`` with the target, runs one pass over prompt +
    continuation keeping every layer's hidden state, and scores each candidate E by its exact
    greedy acceptance (``simulate_tau``) and measured step costs (with KV reuse: k + 1 draft
    feeds through layers < E, verification through layers >= E). Default candidates: every
    ``max(1, L // 8)`` layers below L.
    """
    prompt_ids, L = _check_prompt(prompt_ids, tokens), target.num_layers
    candidates = list(candidates or range(max(1, L // 8), L, max(1, L // 8)))
    if any(not isinstance(e, int) or not 1 <= e <= L for e in candidates):
        raise ConfigError(f"exit layer candidates must be integers in [1, {L}], got {candidates!r}")
    cont = _greedy_continuation(target, prompt_ids, tokens)
    cache, hidden = _layer_pass(target, prompt_ids + cont[:-1], tokens)
    truth = np.array(cont)
    plain = _step_cost(target, range(L), cache, 1)
    table = []
    for e in candidates:
        matches = np.array(mx.argmax(target.logits(hidden[e]), axis=-1)) == truth
        draft = _step_cost(target, range(e), cache, 1)
        # with KV reuse a step feeds k + 1 nodes through layers < E and verifies layers >= E
        verify = _step_cost(target, range(e, L), cache, num_draft + 1) if e < L else 0.0
        tau = simulate_tau(matches, num_draft)
        table.append(dict(exit_layer=e, accepted=float(matches.mean()), tau=tau,
                          draft_ms=draft * 1e3, verify_ms=verify * 1e3, plain_ms=plain * 1e3,
                          speedup=expected_speedup(tau, num_draft + 1, draft, verify, plain)))
    best, reason = choose_best(table, "exit_layer", min_speedup)
    return CalibrationResult(best, table, reason)


def search_layer_subset(target: Target, prompt_ids: list[int], num_draft: int = 4, tokens: int = 32,
                        max_forwards: int = 40, beam: int = 3, patience: int = 2,
                        min_speedup: float = 1.05) -> CalibrationResult:
    """Greedy search for the layers to draft through (first and last layer always kept).

    Starting from all layers, each round tries dropping each of the ``beam`` remaining layers
    that change the hidden state least (relative residual update on the calibration tokens),
    keeps the drop that loses the least draft/target agreement, and records the expected
    speedup. Stops after ``patience`` rounds without improvement or ``max_forwards`` scoring
    passes; ``best`` is the fastest subset seen, None when it does not beat plain decoding.
    """
    prompt_ids, L = _check_prompt(prompt_ids, tokens), target.num_layers
    cont = _greedy_continuation(target, prompt_ids, tokens)
    seq, truth = prompt_ids + cont[:-1], np.array(cont)
    cache, hidden = _layer_pass(target, seq, tokens)
    plain, verify = _base_costs(target, cache, num_draft)
    update = [float(mx.mean(mx.linalg.norm(hidden[i + 1] - hidden[i], axis=-1)
                            / mx.linalg.norm(hidden[i], axis=-1))) for i in range(L)]

    def score(layers: list[int]) -> dict:
        sub = LayerSubset(target, layers)
        matches = np.array(mx.argmax(sub.score(seq, sub.make_cache()).logits[-tokens:], axis=-1)) == truth
        draft, tau = _step_cost(target, layers, cache, 1), simulate_tau(matches, num_draft)
        return dict(layers=layers, accepted=float(matches.mean()), tau=tau, draft_ms=draft * 1e3,
                    verify_ms=verify * 1e3, plain_ms=plain * 1e3,
                    speedup=expected_speedup(tau, num_draft, draft, verify, plain))

    layers, table, forwards, stale, best_speedup = list(range(L)), [], 0, 0, 0.0
    sources = target.model.kv_sources()
    while stale < patience and forwards < max_forwards:
        read = {sources[i] for i in layers if sources[i] != i}  # kept while a sharer is
        droppable = sorted((i for i in layers[1:-1] if i not in read), key=lambda i: update[i])[:beam]
        if not droppable:
            break
        tried = [score([i for i in layers if i != d]) for d in droppable[: max_forwards - forwards]]
        forwards += len(tried)
        row = max(tried, key=lambda r: r["accepted"])
        table.append(row)
        layers = row["layers"]
        stale = 0 if row["speedup"] > best_speedup else stale + 1
        best_speedup = max(best_speedup, row["speedup"])
    best, reason = choose_best(table, "layers", min_speedup)
    return CalibrationResult(best, table, reason)


_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {(method, k): result}


def calibrated(target: Target, method: str, num_draft: int) -> CalibrationResult:
    """The calibration of ``method`` ('early-exit' or 'layer-skip') on ``target``, run once per
    target and draft length (the server and the chat build a drafter per request)."""
    memo = _MEMO.setdefault(target, {})
    if (method, num_draft) not in memo:
        search = calibrate_exit_layer if method == "early-exit" else search_layer_subset
        memo[method, num_draft] = search(target, calibration_ids(target), num_draft=num_draft)
    return memo[method, num_draft]
