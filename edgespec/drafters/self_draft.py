"""Self-drafting: the target drafts for itself through a subset of its own layers (lossless).

Both methods are the draft-model drafter (``draft_model.py``) driven by :class:`LayerSubset`,
an adapter that runs the target's own weights (no copy) through some of its layers, then its
final norm and LM head:

- **early exit** (LayerSkip-style): the first E layers. ``calibrate_exit_layer`` picks E;
- **layer skip** (Draft & Verify-style): a subset with middle layers skipped, found by
  ``search_layer_subset``; the chain ends early once the draft's top probability falls under
  ``confidence`` (whether a node gets a child depends only on its prefix, so this stays lossless).

The engine verifies every draft, so the output is the target's (greedy) or distributed as the
target's (sampling) whatever the subset; a bad subset costs only speed. Calibration therefore
says when no subset beats plain decoding (``best is None`` with a ``reason``): the caller should
then decode plainly. On the demo model that is the usual outcome (first 12 of 30 layers: 6% of
drafts accepted).

The drafter's KV cache is its own and has one slot per layer it runs (slot j holds layer
``layers[j]``): a KVCache with slots for layers that are never run cannot compact its sliding
window (``KVCache._compact`` slices every slot).

KV reuse (early exit only): under the engine, ``EarlyExitDrafter`` drafts inside the target's
own cache (``share_cache``). Layers < E of a token are the same computation for draft and
target, so the draft writes their keys/values into the target cache's scratch slots, feeds
every node (the last draft too) and hands the verifier the hidden state entering layer E in
``tree.reuse``; ``Target.forward`` then runs layers E..L-1 only and ``commit(path)`` keeps the
accepted nodes' slots in every layer. That saves E/L of each verification, the draft's own
prefill and its KV cache. Layer skip cannot do this: a layer after a skipped one sees a
different input than in the target.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..cache import KVCache
from ..config import SamplingConfig
from ..errors import ConfigError
from ..kernels.attention import prepare
from ..targets.target import Target, TargetOutput
from ..tree import DraftTree, LayerReuse, chain_mask
from ..verify import Accepted
from .draft_model import DraftModelDrafter


class LayerSubset:
    """The target's weights through ``layers`` (increasing ids), then final norm + LM head.

    Offers what DraftModelDrafter uses of a Target: ``forward``, ``make_cache`` and ``name``.
    """

    def __init__(self, target: Target, layers: Sequence[int]):
        layers, L = list(layers), target.num_layers
        if not layers or layers != sorted(set(layers)) or not 0 <= layers[0] <= layers[-1] < L:
            raise ConfigError(f"layers must be distinct increasing layer ids in [0, {L}) "
                              f"({target.name} has {L} layers), got {layers!r}")
        self.target, self.layers = target, layers

    @property
    def name(self) -> str:
        return f"{self.target.name}[{len(self.layers)} of {self.target.num_layers} layers]"

    def make_cache(self) -> KVCache:
        return KVCache(len(self.layers), window=self.target.args.sliding_window)

    def forward(self, tokens, positions, mask, cache: KVCache) -> TargetOutput:
        """Like ``Target.forward``; ``cache`` comes from ``make_cache`` (slot j = ``layers[j]``)."""
        tokens = tokens if isinstance(tokens, mx.array) else mx.array(tokens)
        positions, mask = prepare(positions, mask)  # once, not in every layer
        cache.reserve(tokens.shape[0])
        model = self.target.model
        x = model.model.embed_tokens(tokens[None])
        for j, i in enumerate(self.layers):
            x = model.model.layers[i](x, positions, mask, cache, j)
        return TargetOutput(model.logits(x[0]), x[0])


class _SelfDrafter(DraftModelDrafter):
    """DraftModelDrafter over a LayerSubset; optionally ends the chain on low confidence."""

    def __init__(self, target: Target, layers: Sequence[int], sampling: SamplingConfig,
                 num_draft: int, max_draft: int, adaptive: bool, confidence: float = 0.0):
        if not 0.0 <= confidence < 1.0:
            raise ConfigError(f"confidence must be in [0, 1) (0 = off), got {confidence!r}")
        super().__init__(LayerSubset(target, layers), sampling, num_draft, max_draft, adaptive,
                         vocab_size=target.args.vocab_size)
        self.layers = self.draft.layers
        self.confidence = confidence

    def _longest(self) -> int:
        return self.length.maximum if self.confidence else self.length.k  # confidence decides

    def _stop_after(self, logits: mx.array) -> bool:
        return bool(self.confidence) and _top_prob(logits) < self.confidence


def _top_prob(logits: mx.array) -> float:
    return float(mx.max(mx.softmax(logits.astype(mx.float32))).item())


class EarlyExitDrafter(_SelfDrafter):
    """Drafts with the target's first ``exit_layer`` layers + final norm + head (LayerSkip)."""

    name = "early-exit"

    def __init__(self, target: Target, sampling: SamplingConfig, exit_layer: int,
                 num_draft: int = 4, max_draft: int = 12, adaptive: bool = True):
        L = target.num_layers
        if isinstance(exit_layer, bool) or not isinstance(exit_layer, int) or not 1 <= exit_layer <= L:
            raise ConfigError(f"exit_layer must be an integer in [1, {L}] "
                              f"({target.name} has {L} layers), got {exit_layer!r}")
        super().__init__(target, range(exit_layer), sampling, num_draft, max_draft, adaptive)
        self.exit_layer = exit_layer
        self.target = target
        self.shared: KVCache | None = None

    def share_cache(self, cache: KVCache) -> None:
        """Draft inside the target's own cache (the engine calls this before ``prefill``).

        The first E layers of a token are the same computation for draft and target, so the
        draft writes their keys/values straight into the target cache's scratch slots and hands
        the verifier the hidden state entering layer E (``tree.reuse``); verification then runs
        layers E..L-1 only. Nothing is prefilled for the draft (the target's prefill already
        holds layers < E), and the draft keeps no cache of its own.
        """
        self.shared = cache

    def prefill(self, tokens: list[int], target_out: TargetOutput | None,
                sampling: SamplingConfig | None = None) -> None:
        if self.shared is None:
            return super().prefill(tokens, target_out, sampling)
        self._start(tokens, sampling)

    def _lower(self, token: int) -> mx.array:
        """Run ``token`` through layers < E in the shared cache, committing its slot (the caller
        trims). Returns the hidden state entering layer E, shape (1, H)."""
        cache = self.shared
        cache.reserve(1)
        mask = chain_mask(1, cache.key_positions(), cache.offset, cache.window)
        x = self.target.model(mx.array([[token]]), cache.offset, mask, cache,
                              layers=range(self.exit_layer))
        cache.commit()
        return x[0]

    def propose(self, budget: int) -> DraftTree:
        if self.shared is None:
            return super().propose(budget)
        k, root = min(self._longest(), budget), self.history[-1]
        if k <= 0:
            return DraftTree.chain(root, [])
        cache = self.shared
        cache.reserve(k + 1)  # a sliding window compacts now, not after the slots are filled
        hidden, drafts, qs, token, stop = [], [], [], root, False
        while True:  # every node is fed once (the last draft too: the verifier needs it)
            hidden.append(self._lower(token))
            if len(drafts) == k or stop:
                break
            logits = self.target.model.logits(hidden[-1])[0]
            token, q = self._choose(logits)
            drafts.append(token)
            qs.append(q)
            stop = self._stop_after(logits)
        cache.trim(len(hidden))  # back to the committed history; the slots keep their values
        q_rows = None if self.sampling.greedy else np.stack(qs + [np.zeros_like(qs[0])])
        tree = DraftTree.chain(root, drafts, q_rows)
        tree.reuse = LayerReuse(self.exit_layer, mx.concatenate(hidden, axis=0))
        return tree

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput) -> None:
        if self.shared is None:
            return super().update(accepted, tree, target_out)
        self.history.extend(accepted.tokens)
        self.length.observe(tree.num_drafted, accepted.num_accepted)


class LayerSkipDrafter(_SelfDrafter):
    """Drafts through ``layers`` of the target (Draft & Verify).

    With ``confidence`` > 0 the chain runs up to ``max_draft`` tokens and ends after the first
    draft whose top probability is under ``confidence``; with 0 it is ``num_draft`` long
    (adaptive when ``adaptive``).
    """

    name = "layer-skip"

    def __init__(self, target: Target, sampling: SamplingConfig, layers: Sequence[int],
                 num_draft: int = 4, max_draft: int = 12, confidence: float = 0.6,
                 adaptive: bool = True):
        super().__init__(target, layers, sampling, num_draft, max_draft, adaptive, confidence)


# ---- calibration -------------------------------------------------------------------------


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
        cache.reserve(len(seq))
        mask = chain_mask(len(seq), cache.key_positions(), cache.offset, cache.window)
        logits = target.forward(seq, cache.offset, mask, cache).logits[-1]
        cache.commit()
        seq = [int(mx.argmax(logits).item())]
        out.append(seq[0])
    return out


def _layer_pass(target: Target, seq: list[int], n: int) -> tuple[KVCache, list[mx.array]]:
    """One full pass over ``seq``: its committed cache and the hidden state (n, H) of the last
    n tokens entering each layer (index L: after the last layer)."""
    cache = target.make_cache()
    cache.reserve(len(seq))
    positions, mask = prepare(0, chain_mask(len(seq), cache.key_positions(), 0, cache.window))
    x = target.model.model.embed_tokens(mx.array(seq)[None])
    hidden = [x[0, -n:]]
    for i, layer in enumerate(target.model.model.layers):
        x = layer(x, positions, mask, cache, i)
        hidden.append(x[0, -n:])
    cache.commit()
    mx.eval(hidden, cache.state())
    return cache, hidden


def _step_cost(target: Target, layers: Sequence[int], cache: KVCache, n: int, reps: int = 3) -> float:
    """Seconds of one n-token step through ``layers`` + head after ``cache``'s tokens (real
    layer ids; nothing is committed): the fastest of ``reps``, the least disturbed by other load."""
    tokens = mx.zeros((1, n), dtype=mx.int32)
    times = []
    for _ in range(reps + 1):  # the first run warms up
        t0 = time.perf_counter()
        cache.reserve(n)
        mask = chain_mask(n, cache.key_positions(), cache.offset, cache.window)
        x = target.model(tokens, cache.offset, mask, cache, layers=layers)
        mx.argmax(target.model.logits(x[0, -1])).item()
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
        matches = np.array(mx.argmax(target.model.logits(hidden[e]), axis=-1)) == truth
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
        c = sub.make_cache()
        mask = chain_mask(len(seq), c.key_positions(), 0, c.window)
        matches = np.array(mx.argmax(sub.forward(seq, 0, mask, c).logits[-tokens:], axis=-1)) == truth
        draft, tau = _step_cost(target, layers, cache, 1), simulate_tau(matches, num_draft)
        return dict(layers=layers, accepted=float(matches.mean()), tau=tau, draft_ms=draft * 1e3,
                    verify_ms=verify * 1e3, plain_ms=plain * 1e3,
                    speedup=expected_speedup(tau, num_draft, draft, verify, plain))

    layers, table, forwards, stale, best_speedup = list(range(L)), [], 0, 0, 0.0
    while stale < patience and forwards < max_forwards:
        droppable = sorted(layers[1:-1], key=lambda i: update[i])[:beam]
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
