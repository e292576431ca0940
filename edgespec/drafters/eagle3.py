"""EAGLE-3 drafting: an EAGLE-2 dynamic tree grown by a trained EAGLE-3 head.

The head (``heads/eagle3.py``) runs over its own KV cache of *pairs*: the pair at position t is
(the target's fused features at t, the embedding of token t+1) and predicts token t+2. The
drafter keeps one pair per committed position but the root (whose features come with the next
verification), and the last pair's logits and output hidden state, which predict the root's
children.

``propose``, per depth d = 1, 2, ...: the top-``k`` depth-d nodes by cumulative draft
log-probability (the frontier) go through the head in one forward (input: the parent's output
hidden state and the node's token; position root - 1 + d; attention: every committed pair, the
node's drafted ancestors and itself), each giving its top-``k`` children. The head's cache holds
only true pairs: a forward scores the earlier depths' frontiers again beside the new one (the
drafted tree so far as the rows of one ``TreeMask``, exactly the target's verify mask), so that
it runs as the head's one native operation where the kernels do; those rows' results equal the
earlier ones (a row does not depend on the rows beside it) and only the frontier's logits are
computed. Nothing is committed or trimmed. Then the best nodes over all depths are kept (ancestor-
closed): ``nodes`` of them, or as many as maximise expected tokens per second on this device's
verify-cost curve, each node's acceptance probability being its calibrated path probability
(``confidence.py``). Another depth costs a head forward (``depth_ms``, measured), so it is
grown only while it pays: when the best rate with that forward's cost and the frontier's
estimated children (each frontier node's path probability times the calibrated probabilities
its children have had, best first: ``child_edges``, a moving average) beats the best rate
without it, and while some node of the newest depth makes the cut.

``update`` feeds the pairs of the accepted path (the true features of the root and accepted
nodes, each with the token that followed it) and learns the calibration from which tried nodes
were accepted. After a step another drafter proposed (``auto``'s other arms), the pairs wait in
``pending`` and go through the head in one forward when this drafter next proposes (or after
``_CHUNK`` tokens): an arm that is not chosen costs almost nothing per step. Children are deterministic top-k proposals (no ``q``): lossless under greedy and
sampling alike through ``verify.accept``.

**Prompt lookup beside the head** (``lookup``, which the ``eagle3`` method gives it): when the
text's latest words occurred before with at least ``SURE_MATCH`` (3) tokens matched, what
followed them then is right most of the time, more often than a small head's guesses on text
it copies. Such a step drafts lookup's branch alone, at no head cost: the step's pairs wait in
``pending`` like another drafter's, and go through the head in one forward when it next drafts.
(Joining the branch to the head's tree in one verification was measured too, on training-style
prompts: a higher tau, less speed, so the branch goes alone; see docs/measurements.md, "prompt
lookup beside the EAGLE-3 head".) ``auto``'s EAGLE-3 arm has it too: while auto's lookup (or
corpus) arm is in play, that arm is sure first and takes such steps; once it is retired, the
EAGLE-3 arm takes them, so they are not lost.

With prefix reuse the engine scores only the prompt's tail; the drafter keeps the pairs and
fused features it had for the shared prefix, and otherwise starts its cache at the first
position it has features for (drafting from less context, still lossless).
"""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from ..config import SamplingConfig
from ..heads.eagle3 import Eagle3Head
from ..kernels.backend import SMALL_M_MAX
from ..kernels.fused_block import ManyMasks
from ..kernels.tree_mask import MAX_NODES, TreeMask, ancestor_bits, tree_mask
from ..prompt import shared_prefix
from ..targets.cost import CostCurve, best_budget
from ..targets.target import Target, TargetOutput
from ..tree import DraftTree, chain_mask, subtree
from ..verify import Accepted
from .base import Drafter
from .confidence import Calibration, choose, path_probs, top_k
from .lookup import PromptLookupDrafter

_CHUNK = 512
MAX_DEPTH = 8
_EMA = 0.8
_EXPLORE = 16  # steps kept at depth 1 before one forward re-measures what a depth gives


class Eagle3Drafter(Drafter):
    name = "eagle3"

    def __init__(self, target: Target, head, curve: CostCurve | None, *, top_k: int = 4,
                 nodes: int | None = None, max_nodes: int = 32, max_depth: int = MAX_DEPTH,
                 lookup: PromptLookupDrafter | None = None):
        """``head``: an ``Eagle3Head`` (checked against ``target``); ``nodes``: verify exactly
        that many drafted nodes per step (None: sized by ``curve`` and the calibration);
        ``lookup``: prompt lookup, which drafts the steps its match is sure of (above)."""
        assert nodes is not None or curve is not None, "a fixed node count or a cost curve"
        self.target, self.head, self.curve, self.lookup = target, head, curve, lookup
        self.target_features = tuple(head.config.aux_layers)
        self.top_k, self.nodes, self.max_depth = top_k, nodes, max_depth
        self.max_nodes = min(max_nodes, 63)
        self.calibration = Calibration()
        self.depth_ms = self.update_ms = 0.0  # measured head costs (moving averages)
        self.child_edges: np.ndarray | None = None  # calibrated edges of a forward's children
        self.held_back = 0  # steps in a row that ``_deeper_pays`` kept at depth 1
        self._exploring = False  # this step's forward was forced to re-measure
        self.defer = False  # beside other decodings: the batch feeds the pairs (``feed_many``)
        self.reset()

    def reset(self) -> None:
        self.cache = self.head.make_cache()
        self.base = 0  # absolute position of the head cache's slot 0
        self.history: list[int] = []
        self.feats: list[mx.array] = []  # fused features of positions feat_base.. in chunks
        self.feat_base = 0
        self.last: tuple[mx.array, mx.array] | None = None  # last pair's (out, logits) row
        self.pending: list[tuple[mx.array, list[int]]] = []  # pairs not yet fed to the head
        self.due = False  # the pending pairs are due (deferred by ``update``: ``head_feeds``)
        self._tree: DraftTree | None = None  # the last proposal
        self._own = False  # whether the head drafted it (else lookup's branch, or nothing)
        self._confidence: np.ndarray | None = None
        if self.lookup is not None:
            self.lookup.reset()

    # ---- the committed history --------------------------------------------------------------

    def _fused(self, out: TargetOutput, rows=None) -> mx.array:
        parts = [out.captured[i] if rows is None else out.captured[i][rows]
                 for i in self.target_features]
        return self.head.fuse_rows(mx.concatenate(parts, axis=-1))

    def _features(self, a: int, b: int) -> mx.array | None:
        """Stored fused features of positions [a, b), or None when not all are held."""
        held = sum(f.shape[0] for f in self.feats)
        if a < self.feat_base or b > self.feat_base + held or a > b:
            return None
        if a == b:
            return mx.zeros((0, self.target.args.hidden_size))
        return mx.concatenate(self.feats)[a - self.feat_base : b - self.feat_base]

    def _feed(self, h: mx.array, tokens: list[int]) -> None:
        """Commit the pairs (h[i], tokens[i]) at the next positions; keep the last one's output."""
        for a in range(0, len(tokens), _CHUNK):
            n = len(tokens[a : a + _CHUNK])
            first = self.base + self.cache.offset
            mask = (tree_mask(None, n, self.base, first, None) if n <= MAX_NODES
                    else chain_mask(n, np.arange(self.base, first), first, None))
            _, out = self.head.step(self._embed(tokens[a : a + n]), h[a : a + n], first, mask,
                                    self.cache)
            self.cache.commit()
            if a + _CHUNK < len(tokens):  # another chunk follows: evaluate this one first
                mx.eval(self.cache.state())
        last = out[-1:]
        self.last = (last, self.head.logits(last))
        # the pairs' keys/values and the last row's logits in one evaluation: a drafting step
        # waits once for the head after verification, not twice
        mx.eval(self.cache.state(), self.last)

    def _embed(self, tokens) -> mx.array:
        return self.target.model.embed(mx.array(tokens, dtype=mx.int32))

    def _pending_pairs(self) -> tuple[mx.array, list[int]]:
        """The pending pairs as one array of features and their tokens."""
        return (mx.concatenate([h for h, _ in self.pending]),
                [t for _, ts in self.pending for t in ts])

    def _flush(self) -> None:
        """Feed the pending pairs in one go (their features are already in ``feats``)."""
        self.due = False
        if self.pending:
            h, tokens = self._pending_pairs()
            self.pending = []
            self._feed(h, tokens)

    def _note_update_ms(self, ms: float) -> None:
        """Fold what feeding a step's pairs cost into ``update_ms`` (a moving average)."""
        self.update_ms = ms if not self.update_ms else _EMA * self.update_ms + (1 - _EMA) * ms

    def prefill(self, tokens: list[int], target_out: TargetOutput | None,
                sampling: SamplingConfig | None = None) -> None:
        self.pending = []  # the pairs are fed below from ``feats``, from the cache's end on
        rows = target_out.captured[self.target_features[0]].shape[0] if target_out else 0
        start = len(tokens) - 1 - rows  # prompt positions the engine did not score (reused)
        new = self._fused(target_out) if rows else mx.zeros((0, self.target.args.hidden_size))
        common = shared_prefix(self.history, tokens[:-1])  # shared with what this drafter saw
        # pair t stays right while token t+1 is shared: pairs [base, keep) are kept
        keep = min(self.base + self.cache.offset, common - 1)
        kept = self._features(self.base, keep)
        h = None
        if kept is not None and keep >= start:
            h = new[keep - start :]
        elif kept is not None and (old := self._features(keep, start)) is not None:
            h = mx.concatenate([old, new])
        if h is None:  # nothing reusable: start the head's cache where the features start
            self.reset()
            self.base = self.feat_base = keep = start
            kept, h = new[:0], new
        self.cache.trim(self.base + self.cache.offset - keep)
        self.feats, self.feat_base = [kept, h], self.base
        self.history = list(tokens)
        self._tree = None
        if self.lookup is not None:
            self.lookup.prefill(tokens, None)
        if h.shape[0]:
            self._feed(h, tokens[keep + 1 :])
        else:
            self.last = None  # no features yet: nothing to draft from until a verification

    # ---- drafting ---------------------------------------------------------------------------

    def propose(self, budget: int) -> DraftTree:
        root = self.history[-1]
        self._tree, self._own = None, False
        if budget <= 0:
            return DraftTree.chain(root, [])
        if self.lookup is not None and self.lookup.confident():  # lookup's branch alone
            self._tree = self.lookup.propose(budget)
            return self._tree
        self._flush()
        if self.last is None:
            return DraftTree.chain(root, [])
        self._tree, self._own = self._propose_own(root, budget), True
        return self._tree

    def _propose_own(self, root: int, budget: int) -> DraftTree:
        """The head's tree (``_confidence`` set for its nodes)."""
        position = self.base + self.cache.offset  # the depth-1 nodes' pair position
        tokens, parents, conf, logp, depth = [root], [-1], [1.0], [0.0], [0]
        out_of = {0: self.last[0]}  # node -> its forward's output hidden row (1, H)
        fed: list[int] = []  # nodes an earlier depth's forward took (they come again as rows)
        self._expand([0], self.last[1], tokens, parents, conf, logp, depth)
        forwards, spent, self._exploring = 0, 0.0, False
        cap = budget  # at most this many drafted nodes
        for d in range(1, min(cap, self.max_depth)):
            level = [u for u in range(len(tokens)) if depth[u] == d]
            keep, budget = self._cut(parents, conf, forwards, cap)
            if not any(depth[u] == d for u in keep):
                break  # the newest depth did not make the cut: deeper nodes would not either
            frontier = sorted(level, key=lambda u: -logp[u])[: self.top_k]
            if budget is not None and not self._deeper_pays(parents, conf, frontier, forwards,
                                                            budget.rate):
                break
            t1 = time.perf_counter()  # what one more depth costs: from here to its children
            rows = fed + frontier
            if len(rows) > MAX_NODES:
                break
            mask = self._rows_mask(rows, parents, depth, position)
            h = mx.concatenate([out_of[parents[u]] for u in rows])
            logits, out = self.head.step(self._embed([tokens[u] for u in rows]), h, None, mask,
                                         self.cache, last=len(frontier))
            forwards += 1
            for i, u in enumerate(frontier):
                out_of[u] = out[len(fed) + i : len(fed) + i + 1]
            fed = rows
            first_child = len(tokens)
            self._expand(frontier, logits, tokens, parents, conf, logp, depth)
            self._learn_child_edges(np.array(conf[first_child:]).reshape(len(frontier), -1))
            spent += time.perf_counter() - t1
        keep, _ = self._cut(parents, conf, forwards, cap)
        tree = subtree(tokens, parents, keep)
        self._confidence = np.array([1.0] + [conf[u] for u in sorted(keep)])
        if forwards:  # a re-measuring step replaces the estimate (it may have been an outlier)
            ms = spent * 1e3 / forwards
            self.depth_ms = (ms if not self.depth_ms or self._exploring
                             else _EMA * self.depth_ms + (1 - _EMA) * ms)
            self.held_back = 0
        return tree

    def _expand(self, nodes: list[int], logits: mx.array, tokens, parents, conf, logp,
                depth) -> None:
        """Add each node's top-k children (target ids, probabilities under the head); row i of
        ``logits`` (len(nodes), Vd) is node ``nodes[i]``'s. One evaluation for all rows."""
        # on the host: over a few rows of Vd, MLX's CPU argpartition and reductions were
        # measured slower than numpy's (docs/measurements.md, "Figures that stood in the design
        # text")
        lg = np.array(logits, dtype=np.float32)
        top = top_k(lg, self.top_k)  # best first
        m = lg.max(axis=-1, keepdims=True)
        lse = m + np.log(np.exp(lg - m).sum(axis=-1, keepdims=True))
        probs = np.exp(np.take_along_axis(lg, top, axis=-1) - lse)
        ids = self.head.to_target_ids(top)
        for r, u in enumerate(nodes):
            for i in range(self.top_k):
                tokens.append(int(ids[r, i]))
                parents.append(u)
                conf.append(float(probs[r, i]))
                logp.append(logp[u] + float(np.log(max(probs[r, i], 1e-30))))
                depth.append(depth[u] + 1)

    def _rows_mask(self, rows: list[int], parents, depth, position: int) -> TreeMask:
        """The TreeMask of a depth's forward over drafted nodes ``rows`` (each one's drafted
        ancestors among the rows before it): every true pair, then the rows' own tree."""
        at = {u: i for i, u in enumerate(rows)}
        anc = np.eye(len(rows), dtype=bool)
        for i, u in enumerate(rows):
            p = parents[u]
            if p > 0:
                anc[i] |= anc[at[p]]
        qpos = np.array([position + depth[u] - 1 for u in rows], dtype=np.int32)
        return TreeMask(ancestor_bits(anc), qpos, self.base, self.cache.offset, None)

    def _draft_ms(self, forwards: int) -> float:
        """What a step costs the drafter with ``forwards`` head forwards in ``propose``."""
        return self.update_ms + self.depth_ms * forwards

    def _cut(self, parents, conf, forwards: int, cap: int | None = None):
        """The nodes to verify (``confidence.choose``), at most ``cap`` of them (the step's
        budget: ``Drafter.propose``'s contract) besides the head's own limit."""
        limit = self.max_nodes if cap is None else min(self.max_nodes, cap)
        return choose(parents, np.array(conf), self.calibration, self.curve,
                      self._draft_ms(forwards), self.nodes, limit)

    def _deeper_pays(self, parents, conf, frontier: list[int], forwards: int,
                     rate_now: float) -> bool:
        """Whether one more head forward (the ``frontier``'s children) is expected to raise the
        step's committed tokens per ms: the best budget over the nodes so far plus the
        estimated children, paying ``forwards + 1`` forwards, against ``rate_now`` (``_cut``'s
        best budget over the nodes so far, paying ``forwards``). Without an estimate yet (no forward measured) it
        expands, which is how the estimate is learnt; and after ``_EXPLORE`` steps in a row kept
        at depth 1 it expands once, so that one slow measurement cannot stop all expansion."""
        if self.child_edges is None or not self.depth_ms or self.held_back >= _EXPLORE:
            self._exploring = self.held_back >= _EXPLORE
            self.held_back = 0
            return True
        probs = path_probs(parents, self.calibration(np.array(conf)))[1:]
        children = np.outer(probs[np.array(frontier) - 1], self.child_edges).ravel()
        more = best_budget(np.sort(np.concatenate([probs, children]))[::-1], self.curve,
                           self._draft_ms(forwards + 1), self.max_nodes)
        if more.rate > rate_now:
            return True
        self.held_back += forwards == 0
        return False

    def _learn_child_edges(self, child_conf: np.ndarray) -> None:
        """Fold one forward's children (rows: parents, columns: their top-k children, best
        first) into ``child_edges``: their calibrated edge probabilities, averaged over parents."""
        edges = np.sort(self.calibration(child_conf), axis=1)[:, ::-1].mean(axis=0)
        self.child_edges = edges if self.child_edges is None else (
            _EMA * self.child_edges + (1 - _EMA) * edges)

    # ---- beside other decodings -------------------------------------------------------------

    def share_heads(self, on: bool) -> None:
        self.defer = on

    def head_feeds(self) -> list[Eagle3Drafter]:
        return [self] if self.due and self.pending else []

    # ---- learning the outcome ---------------------------------------------------------------

    def update(self, accepted: Accepted, tree: DraftTree, target_out: TargetOutput) -> None:
        t0 = time.perf_counter()
        path = accepted.path
        mine = tree is self._tree and tree is not None
        own = mine and self._own  # the head drafted this step's tree
        if own and tree.num_drafted:
            self.calibration.observe_tree(tree, self._confidence, path)
        if self.lookup is not None:  # its streak learns from its own branches only
            ours = mine and not own
            self.lookup.update(accepted, tree if ours else DraftTree.chain(tree.tokens[0], []),
                               target_out)
        self._tree, self._own = None, False
        h = self._fused(target_out, mx.array(path))
        self.feats.append(h)
        self.pending.append((h, accepted.tokens))
        self.history.extend(accepted.tokens)
        waiting = sum(len(ts) for _, ts in self.pending)
        if not own and waiting < _CHUNK:
            return  # another drafter's step, or lookup's: fed when the head next drafts
        if self.defer and waiting <= SMALL_M_MAX:
            self.due = True  # fed with the other decodings' (``feed_many``), or by ``propose``
            return
        self._flush()
        mx.eval(self.last)
        self._note_update_ms((time.perf_counter() - t0) * 1e3)


def feed_many(drafters: list[Eagle3Drafter]) -> None:
    """Feed every drafter's pending pairs (``head_feeds``: deferred by ``update`` beside other
    decodings) through their shared head in one forward: the head's layer as one native
    operation over all drafters' rows, each attending to its own cache
    (``heads/eagle3.NativeLayer.many``), then the draft LM head over all last rows at once.
    A row gets the bits it gets fed alone (the operation is row by row). Where that cannot run
    (one drafter, different heads, a head whose ``step`` is its own, more rows than the native
    block takes, a layer it does not take), each drafter feeds its own. Each drafter's
    ``update_ms`` takes its share of the forward's time."""
    jobs = [d for d in drafters if d.pending]
    if not jobs:
        return
    t0 = time.perf_counter()
    head = jobs[0].head
    pairs = [d._pending_pairs() for d in jobs]
    rows = [len(ts) for _, ts in pairs]
    native = None
    standard = type(head).step is Eagle3Head.step  # a head with its own step goes through it
    if (len(jobs) > 1 and standard and all(d.head is head for d in jobs)
            and sum(rows) <= SMALL_M_MAX):
        masks = [tree_mask(None, n, d.base, d.base + d.cache.offset, None)
                 for d, n in zip(jobs, rows)]
        if all(m.cached == d.cache.slots(0) for m, d in zip(masks, jobs)):
            native = head._native_layer(masks[0], jobs[0].cache, 0, rows[0])
    if native is None:
        for d in jobs:
            d._flush()
        return
    x = mx.concatenate([mx.concatenate([d._embed(ts), h], axis=-1)
                        for d, (h, ts) in zip(jobs, pairs)])
    for d, n in zip(jobs, rows):
        d.cache.reserve(n)
    out = native.many(x, ManyMasks(masks), [d.cache for d in jobs], 0)
    ends = np.cumsum(rows).tolist()
    lasts = mx.concatenate([out[e - 1 : e] for e in ends])
    logits = head.logits(lasts)
    for i, d in enumerate(jobs):
        d.cache.commit()
        d.last = (lasts[i : i + 1], logits[i : i + 1])
        d.pending, d.due = [], False
    mx.eval([d.cache.state() for d in jobs], lasts, logits)
    ms = (time.perf_counter() - t0) * 1e3 / len(jobs)
    for d in jobs:
        d._note_update_ms(ms)
