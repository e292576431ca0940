"""MTP drafting: a checkpoint's own multi-token-prediction layer drafts a chain (``--method mtp``).

The layer (``targets/mtp.py``) runs over its own KV cache of *pairs*: the pair at position t is
(the target's hidden state at t, the token at t+1) and predicts token t+2. The drafter keeps one
pair per committed position but the root (whose hidden state comes with the next verification);
the last pair's output predicts the root's child, the first draft. A chain of depth d applies
the layer recursively: draft i+1 comes from the pair (the layer's own output for draft i-1's
row, draft i), written to the cache after the true pairs and trimmed after the verification
(true pairs replace them: they carry the target's hidden states).

**Which hidden state.** The target's hidden state AFTER its final norm, then the layer's
``pre_fc_norm_hidden``; for the chain's later rows the layer's output after ``mtp.norm`` (what
the head scores). This is how the Qwen3-Next/3.5 MTP layers were trained and are served:
vLLM's ``qwen3_next_mtp.py`` feeds it ``Qwen3NextModel.forward``'s return value, which ends in
the final norm, and returns its own output after ``mtp.norm``; LightLLM's pull request #1402
("Qwen3.5 MTP draft needs the hidden after the final norm") raised the mean accepted length on
Qwen3.5-0.8B from 1.80 to 2.74 by switching from the raw (pre-norm) hidden to it; llama.cpp
#24025 made the same change for Qwen3.6. ``tests/test_mtp.py`` pins it against the formula.

Lossless at any temperature: greedy drafts are the argmax; sampled drafts are drawn from the
layer's distribution filtered by the request's ``SamplingConfig`` (``sampling.probs``), attached
as ``q`` for ``verify.accept``.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..config import SamplingConfig
from ..prompt import shared_prefix
from ..sampling import draw, make_rng, probs
from ..targets.target import Target, TargetOutput
from ..tree import DraftTree
from ..verify import Accepted
from .base import AdaptiveLength, Drafter

_CHUNK = 512  # pairs fed per forward; also the most that wait for the next proposal


class MtpDrafter(Drafter):
    name = "mtp"
    wants_hidden = True

    def __init__(self, target: Target, mtp: Target, sampling: SamplingConfig,
                 num_draft: int = 3, max_draft: int = 8, adaptive: bool = True):
        """``mtp``: ``targets.mtp.mtp_target(target)``; the chain's length adapts between 1 and
        ``max_draft`` from ``num_draft`` (``AdaptiveLength``) unless ``adaptive`` is False."""
        self.target, self.mtp = target, mtp
        self.sampling = sampling
        self.length = AdaptiveLength(num_draft, max_draft, adaptive)
        self.rng = make_rng(sampling, stream=1)
        self.reset()

    def reset(self) -> None:
        self.cache = self.mtp.make_cache()
        self.base = 0  # absolute position of the cache's first pair
        self.history: list[int] = []
        self.prompt_len = 0  # the prompt's tokens in history (drafts' output positions follow)
        self.pending: list[tuple[mx.array, list[int]]] = []  # true pairs not yet fed
        self.last: tuple[mx.array, mx.array] | None = None  # last pair's (output, logits)
        self.drafted = 0  # draft pairs in the cache after the true ones
        self._tree: DraftTree | None = None  # the last proposal

    # ---- the committed history --------------------------------------------------------------

    def _normed(self, hidden: mx.array) -> mx.array:
        """The target's hidden states (N, H) after its final norm: the MTP layer's input."""
        return self.target.model.model.norm(hidden)

    def _run(self, tokens: list[int], h: mx.array) -> tuple[mx.array, mx.array]:
        """Score pairs (h[i], tokens[i]) at the cache's next positions and commit them; the
        rows' outputs after ``mtp.norm`` (N, H) and the last row's logits (V,)."""
        ids = mx.array(tokens, dtype=mx.int32)
        layer = self.mtp.model
        out = self.mtp.score(ids, self.cache, hidden=layer.fuse_input(ids, h), head=False)
        self.cache.commit()
        normed = layer.model.norm(out.hidden)
        return normed, layer.head(normed[-1:])[0]

    def _flush(self) -> None:
        """Feed the pending true pairs; keep the last one's output and logits."""
        if not self.pending:
            return
        h = mx.concatenate([h for h, _ in self.pending])
        tokens = [t for _, ts in self.pending for t in ts]
        self.pending = []
        for a in range(0, len(tokens), _CHUNK):
            out, logits = self._run(tokens[a : a + _CHUNK], h[a : a + _CHUNK])
            mx.eval(self.cache.state())
        self.last = (out[-1:], logits)

    def prefill(self, tokens: list[int], target_out: TargetOutput | None,
                sampling: SamplingConfig | None = None) -> None:
        if sampling is not None:
            self.sampling = sampling
        self.rng = make_rng(self.sampling, stream=1)
        rows = target_out.hidden.shape[0] if target_out is not None else 0
        r = len(tokens) - 1  # the root's position
        start = r - rows  # the first scored position (those before came from the reused cache)
        self._trim_drafted()
        self._flush()  # the last request's final pairs (a few): a shared prefix keeps them
        self.last, self._tree = None, None
        # pair t stays right while token t+1 is shared: pairs [base, keep) are kept, and at
        # least the last one is fed again (its output drafts the root's child)
        keep = min(self.base + self.cache.offset, shared_prefix(self.history, tokens) - 1, r - 1)
        if keep < max(start, self.base):  # the kept pairs do not reach the scored rows
            self.reset()
            self.base = keep = start
        self.cache.trim(self.base + self.cache.offset - keep)
        self.history = list(tokens)
        self.prompt_len = len(tokens)
        if keep < r:
            self.pending = [(self._normed(target_out.hidden[keep - start :]), tokens[keep + 1 :])]

    # ---- drafting ---------------------------------------------------------------------------

    def propose(self, budget: int) -> DraftTree:
        root = self.history[-1]
        k = min(self.length.k, budget)
        self._trim_drafted()
        self._flush()
        self._tree = None
        if k <= 0 or self.last is None:
            return DraftTree.chain(root, [])
        out, logits = self.last
        drafts, qs = [], []
        for i in range(k):
            tok, q = self._choose(logits, i)
            drafts.append(tok)
            qs.append(q)
            if i == k - 1:
                break  # the last draft is never fed
            out, logits = self._run([tok], out)
            self.drafted += 1
        q_rows = None if self.sampling.greedy else np.stack(qs + [np.zeros_like(qs[0])])
        self._tree = DraftTree.chain(root, drafts, q_rows)
        return self._tree

    def _choose(self, logits: mx.array, i: int = 0) -> tuple[int, np.ndarray | None]:
        """The ``i``-th draft of a proposal from ``logits`` (and q, when sampling)."""
        if self.sampling.greedy:
            return int(mx.argmax(logits).item()), None
        q = probs(np.array(logits.astype(mx.float32)), self.sampling)
        # the draft's output position: the tokens generated since the prompt, then i more
        return draw(q, self.sampling, self.rng, len(self.history) - self.prompt_len + i), q

    def _trim_drafted(self) -> None:
        """Drop the last proposal's draft pairs (true pairs take their positions)."""
        self.cache.trim(self.drafted)
        self.drafted = 0

    # ---- learning the outcome ---------------------------------------------------------------

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput) -> None:
        """The accepted path's true pairs (each node's target hidden state, the token after it)
        wait to be fed at the next proposal (another drafter's step costs this one nothing)."""
        self._trim_drafted()
        if tree is self._tree:  # its own chain (not another of ``auto``'s arms')
            self.length.observe(tree.num_drafted, accepted.num_accepted)
        self._tree = None
        h = self._normed(target_out.hidden[mx.array(accepted.path)])
        self.pending.append((h, list(accepted.tokens)))
        self.history.extend(accepted.tokens)
        if sum(len(ts) for _, ts in self.pending) >= _CHUNK:
            self._flush()
