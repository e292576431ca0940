"""The decode loop: draft, score the tree in one target pass, verify, commit; repeat.

Contract: for any drafter, the committed tokens are exactly what target-only decoding would
produce (greedy) or are distributed exactly as it (sampling) — the drafter only changes how many
target forwards it takes. The engine owns the target's KV cache; drafters own theirs. Plain
decoding is the same loop with a one-node tree, so the baseline shares every code path.

Phases of one step (named closures in ``Engine._steps``):
  1. ``propose``  drafter -> DraftTree (root = last committed token, not yet in the cache)
  2. ``score``    ``Target.score``: one target forward over all tree nodes -> logits per node
                  (only the upper layers when the drafter ran the lower ones: ``LowerLayers``)
  3. ``accept``   ``verify.accept``: a lossless rule picks the accepted path and the bonus token
  4. ``commit``   the cache keeps the accepted path; the drafter learns the outcome
  5. ``emit``     new tokens -> text delta (in drafted / target runs), stop conditions, a Step

Under rules (``rules.py``: a grammar, the sampling config's penalties) the drafted tree is
first shaped (``rule_tree.py``: forbidden drafts cut, forced tokens added), the target's rows
are transformed per node before ``accept`` (sampled drafts' q conditioned on what the rules
allow), the drafter is told the outcome on its own tree, and the rules commit the new tokens
(finished rules end the generation). ``logprobs`` come from the verifier's raw rows of the
accepted path (``logprobs.py``), so drafting never changes them.

Plain greedy decoding (greedy, the CPU's accept, no rules, no drafter running the target's
lower layers) runs the same forwards pipelined (``plain_pipeline.py``: step t+1's forward in
flight while step t's token is read): always without a drafter, and with one while it proposes
nothing and says its next step will be plain decoding too (``Drafter.plain_next``: ``auto`` when
its bandit keeps choosing plain decoding). The drafter is still shown every committed token
with the target's output of its step. ``Engine(pipeline=False)`` runs the step loop instead (the
tests check the two give the same tokens and logprobs).

The loop receives token ids: prompts are encoded (chat template included) up front by
``prompt.encode_prompt``, and the context window is checked once, by ``prompt.check_context``.

**One generation is a coroutine** (:class:`Decoding`, made by ``Engine.start``): it yields a
:class:`Need` for each target forward it wants and is sent that forward's output, and yields a
Step per step. ``stream`` runs every forward alone; ``batch.Batch`` steps several decodings
together and scores their trees in one forward (``targets/batched.py``). Each decoding has its
own drafter, cache, stats and random stream, so its output does not depend on what runs beside
it. Its cache comes from the engine's prefix store (``prefix_store.PrefixStore``: the longest
prefix of its prompt that any finished decoding left) and goes back there when it ends.
Seeded sampling draws each token with a uniform keyed by (seed, output position)
(``verify.verify_sampling_keyed``): the same tokens whatever is drafted.

**Learning from use**: an engine given a ``recorder`` (``learn/recorder.py``) makes its forwards
also capture the recorder's layers and shows each generation's recording the prefill's rows and
every step's committed path; a generation that fails is not recorded, a closed one keeps what it
committed. The tokens are unchanged: the recorder only copies rows already computed.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from functools import partial

import mlx.core as mx

from .cache import KVCache
from .config import GenerationConfig, SamplingConfig
from .decoding import Decoding, Need, Result, Step  # noqa: F401  (Step, Result: the outputs)
from .drafters.base import Drafter
from .logprobs import TokenLogprob, check_top, token_logprobs
from .penalties import penalties_for
from .plain_pipeline import Forwards, plain_run
from .prefix_store import PrefixStore
from .prompt import Prompt, check_context, encode_prompt
from .rule_tree import masked_q, shape, views
from .rules import Rules
from .targets.batched import Part
from .targets.cost import memoized_curve
from .targets.lower_layers import LowerLayers
from .targets.target import Target, TargetOutput
from .sampling import make_rng
from .stats import Stats
from .stream_text import TextStream
from .tree import DraftTree
from .kernels.backend import metal_kernels, prefill_chunk
from .verify import Accepted, accept

PREFIX_BUDGET_BYTES = 512 * 2**20  # an engine's prefix store, unless it is given another


def _joined(outs: list[TargetOutput], capture: tuple[int, ...], target: Target) -> TargetOutput:
    """The prefill chunks' rows as one TargetOutput (no logits: prefill skips the LM head)."""
    if not outs:  # the whole prompt came from the reused cache
        empty = mx.zeros((0, target.args.hidden_size))
        return TargetOutput(None, empty, {i: empty for i in capture})
    if len(outs) == 1:
        return outs[0]
    return TargetOutput(None, mx.concatenate([o.hidden for o in outs]),
                        {i: mx.concatenate([o.captured[i] for o in outs]) for i in capture})


class Engine:
    """Speculative generation with one target and (optionally) one drafter.

    ``drafter=None`` is plain decoding. ``generate`` returns a :class:`Result`; ``stream`` yields
    :class:`Step` events and leaves the final :class:`Stats` in ``engine.last_stats``.
    """

    def __init__(self, target: Target, drafter: Drafter | None = None,
                 sampling: SamplingConfig | None = None, reuse_prefix: bool = True,
                 pipeline: bool = True, prefix_budget_bytes: int = PREFIX_BUDGET_BYTES,
                 keyed_seeds: bool = True, recorder=None):
        self.target = target
        # learning from use (``learn/recorder.py``): each generation's committed positions'
        # EAGLE-3 features go to the recorder (None: nothing is recorded)
        self.recorder = recorder
        # a seeded sampled request draws each token from a uniform keyed by (seed, position):
        # the same tokens whatever is drafted (verify.verify_sampling_keyed); False: the
        # recursive rejection rule, whose draws depend on the drafts
        self.keyed_seeds = keyed_seeds
        self.reuse_prefix = reuse_prefix
        self.pipeline = pipeline  # plain greedy decoding pipelined (see the module docstring)
        # finished decodings' caches, by prompt prefix (``prefix_store``)
        self.prefixes = PrefixStore(prefix_budget_bytes if reuse_prefix else 0)
        self.drafter = drafter
        self.sampling = sampling or SamplingConfig()
        self.last_stats = Stats()
        self._current: Decoding | None = None

    @property
    def method(self) -> str:
        return self.drafter.name if self.drafter else "none"

    def cancel(self) -> None:
        """Ask a running ``stream`` to stop after its current step (thread-safe flag)."""
        if self._current is not None:
            self._current.cancel()

    def encode(self, prompt: Prompt) -> list[int]:
        """``prompt.encode_prompt`` with this engine's tokenizer (what ``stream`` does first)."""
        return encode_prompt(self.target.tokenizer, prompt)

    def generate(self, prompt: Prompt, **kwargs) -> Result:
        """``stream``'s steps gathered into one :class:`Result` (same keyword arguments)."""
        steps = list(self.stream(prompt, **kwargs))
        return Result.from_steps(steps, self.last_stats)

    def stream(self, prompt: Prompt, *, max_tokens: int | None = None, stop=None,
               generation: GenerationConfig | None = None,
               sampling: SamplingConfig | None = None, rules: Rules | None = None,
               logprobs: int | None = None) -> Iterator[Step]:
        """Generate for ``prompt`` (raw text, chat messages or token ids), yielding a Step per
        target forward.

        ``sampling`` overrides the engine's SamplingConfig for this call (the drafter gets the
        same one). ``engine.drafter`` may be replaced between calls; the KV cache of a shared
        prompt prefix is reused across calls unless ``reuse_prefix=False``.

        ``rules`` transform the target's logits at every tree node (``rules.py``; the sampling
        config's penalties are added in front of them); generation also ends ("stop") when they
        are finished. ``logprobs=N`` (0..20) gives each Step the log-probability of its tokens
        and the N likeliest alternatives (``logprobs.py``: the raw model distribution).
        """
        d = self.start(prompt, max_tokens=max_tokens, stop=stop, generation=generation,
                       sampling=sampling, rules=rules, logprobs=logprobs)
        self._current, self.last_stats = d, d.stats
        yield from d.alone_steps()

    def start(self, prompt: Prompt, *, max_tokens: int | None = None, stop=None,
              generation: GenerationConfig | None = None,
              sampling: SamplingConfig | None = None, rules: Rules | None = None,
              logprobs: int | None = None, drafter: Drafter | None | bool = True,
              record: bool = True) -> Decoding:
        """A :class:`Decoding` of ``prompt`` (``stream``'s arguments), not started: its
        coroutine runs nothing until driven (``alone_steps``, or a scheduler sending it the
        outputs of the forwards it asks for). ``drafter``: the decoding's own (None: plain
        decoding; True: ``engine.drafter``). ``record``: shown to the engine's recorder, if it
        has one (False: this generation is not recorded)."""
        check_top(logprobs)
        given = {k: v for k, v in (("max_tokens", max_tokens), ("stop", stop)) if v is not None}
        gen = generation or GenerationConfig(**given)  # the config's own defaults otherwise
        ids = self.encode(prompt)
        ctx = self.target.context_length
        check_context(ids, ctx, self.target.name)
        cfg = sampling or self.sampling
        penalties = penalties_for(cfg)
        ruled = Rules(([penalties] if penalties else []) + ([rules] if rules else []))
        drafter = self.drafter if drafter is True else drafter
        d = Decoding(drafter, Stats(method=drafter.name if drafter else "none",
                                    prompt_tokens=len(ids)))
        d.gen = self._decode(d, ids, min(gen.max_tokens, ctx - len(ids)), gen, cfg, ruled,
                             logprobs, record)
        return d

    def _decode(self, d: Decoding, ids: list[int], max_new: int, gen: GenerationConfig,
                cfg: SamplingConfig, ruled: Rules, top: int | None,
                record: bool = True) -> Generator:
        """The decoding's coroutine. Its cache comes from the prefix store and goes back there
        when it ends, however it ends, unless a forward it asked for is still unanswered or
        could not be undone (without ``reuse_prefix`` the store's budget is 0: it keeps
        nothing, every take is a fresh cache)."""
        cache, start = self.prefixes.take(ids, self.target.make_cache)
        held = _Held()
        rec = self.recorder.begin(ids, start) if self.recorder is not None and record else None
        try:
            yield from self._steps(d, ids, max_new, gen, cfg, ruled, top, cache, start, held, rec)
        except Exception:  # a failure is not recorded; a close (GeneratorExit) keeps what it
            rec = None  # committed
            raise
        finally:
            if rec is not None:
                rec.end()
            # a forward asked for and never answered wrote scratch rows only: a KV cache is as
            # it was (a hybrid cache's recurrent bookkeeping may not be)
            kept = not held.lost and (not held.asked or type(cache) is KVCache)
            if held.seq is not None and kept:
                self.prefixes.put(held.seq, cache)

    def _steps(self, d: Decoding, ids: list[int], max_new: int, gen: GenerationConfig,
               cfg: SamplingConfig, ruled: Rules, top: int | None, cache, start: int,
               held: _Held, rec=None) -> Generator:
        target, drafter, stats = self.target, d.drafter, d.stats
        stats.cached_tokens = start
        rng = make_rng(cfg, stream=0)
        eos = self.target.tokenizer.eos_token_ids
        text = TextStream(self.target.tokenizer, gen.stop)
        mx.reset_peak_memory()

        lower = None
        if drafter is not None and drafter.lower_layers:  # it drafts through the target's layers
            lower = LowerLayers(target, cache, drafter.lower_layers)

        capture = drafter.target_features if drafter is not None else ()
        if rec is not None:  # the recorder's layers too (computed anyway; only kept)
            capture = tuple(sorted(set(capture) | set(rec.recorder.layers)))
        keep = bool(capture) or (drafter is not None and drafter.wants_hidden)

        def prefill() -> Generator:
            outs, step = [], prefill_chunk(target.model.native_blocks())
            for a in range(start, len(ids) - 1, step):
                out = yield Need(partial(target.score, ids[a : min(a + step, len(ids) - 1)],
                                         cache, capture=capture, head=False))
                cache.commit()
                mx.eval(cache.state(), *((out.hidden, *out.captured.values()) if keep else ()))
                if keep:
                    outs.append(out)
            cache.pin()  # the prompt's end: where a next request sharing the prompt resumes
            joined = _joined(outs, capture, target) if keep else None
            if rec is not None:
                rec.prompt(joined)
            if drafter is not None:
                if drafter.lower_layers:
                    drafter.use_lower_layers(lower)
                drafter.prefill(ids, joined, cfg)

        def propose(root: int, budget: int) -> DraftTree:
            if drafter is None or budget <= 0:
                return DraftTree.chain(root, [])
            if lower is not None:
                lower.begin(budget + 1)
            tree = drafter.propose(budget)
            assert tree.tokens[0] == root, "drafter proposed a tree with the wrong root"
            return tree

        def score(tree: DraftTree, drafted: DraftTree) -> Need:
            if lower is not None and lower.fed:
                if tree is drafted:  # the drafter ran the lower layers: the rest only
                    return Need(partial(lower.score, tree))
                lower.drop()  # rules changed the fed chain: score the verified tree whole
            return Need(partial(target.score, tree, cache, capture=capture),
                        Part(tree, cache, capture))

        def plain_step(token: int, out: TargetOutput, waited: float) -> Step:
            """Commit a pipelined plain step's token (``plain_pipeline.plain_run``)."""
            nonlocal done
            acc, chain = Accepted([0], [token]), DraftTree.chain(seq[-1], [])
            t1 = time.perf_counter()
            if drafter is not None:
                drafter.update(acc, chain, out)
                (stats.accepted_prediction_tokens,
                 stats.rejected_prediction_tokens) = drafter.prediction_tokens()
            if rec is not None:
                rec.step(out, [0], [token])
            stats.draft_s += time.perf_counter() - t1
            stats.verify_s += waited
            stats.target_forwards += 1
            lps = None if top is None else token_logprobs(out.logits, [token], top)
            step, used = self._emit(acc, chain, eos, text, max_new - done, logprobs=lps,
                                    cancelled=d.cancelled)
            done += 1
            stats.generated_tokens += used
            seq.append(token)
            stats.decode_s = time.perf_counter() - t_start
            stats.peak_memory_mb = mx.get_peak_memory() / 2**20
            return step

        def lost() -> None:  # a pipelined forward could not be rolled back
            held.lost = True

        exact = target.exact_rows()

        def room() -> int:  # drafted nodes this step may add: the token limit, the rows a
            left = max_new - done - 1  # forward scores exactly, the row share
            if exact is not None:
                left = min(left, exact - 1)
            return left if d.rows is None else min(left, d.rows - 1)

        t0 = time.perf_counter()
        yield from prefill()
        stats.prefill_s = time.perf_counter() - t0
        root, done = ids[-1], 0
        seq = held.seq = list(ids)  # the cache holds the KV of seq[:-1]
        t_start = time.perf_counter()
        ruled.reset(ids)
        pipelined = (cfg.greedy and self.pipeline and metal_kernels() == "off" and not ruled
                     and lower is None)
        forwards = Forwards(target, cache, capture, keep or top is not None, lost)
        drafter_plain = drafter.plain_next if drafter is not None else (lambda: True)

        def plain_next() -> bool:
            return d.alone() and drafter_plain()

        begin = (lambda: drafter.propose(0)) if drafter is not None else (lambda: None)
        # the curve a drafter sizes its trees on learns what a verify costs here (a forward of
        # this decoding alone, all layers: not batched, not a lower-layers split, and no rules,
        # whose masking would be priced into every later request's trees)
        observed = (memoized_curve(target) if drafter is not None and lower is None and not ruled
                    else None)
        while True:
            t1 = time.perf_counter()
            drafted = propose(root, room())
            if pipelined and drafted.num_drafted == 0 and plain_next():
                for step in plain_run(forwards, root, max_new - done, plain_next, begin,
                                      plain_step, time.perf_counter):
                    yield step
                if step.finish_reason is not None:
                    return
                root = seq[-1]
                continue
            shaped = None
            if ruled and drafter is not None:  # cut, forced runs (plain decoding stays one node)
                shaped = shape(drafted, ruled, room())
            tree = shaped.tree if shaped else drafted
            t2 = time.perf_counter()
            held.asked = True  # until the forward's output arrives
            alone = d.alone()
            out = yield score(tree, drafted)
            held.asked = False
            logits = ruled.apply(tree, out.logits) if ruled else out.logits
            if ruled and tree.q is not None:
                tree = masked_q(tree, logits)
            acc, _ = accept(tree, logits, cfg, rng, at=done if self.keyed_seeds else None)
            t3 = time.perf_counter()
            if observed is not None and alone and d.alone() and tree.num_drafted:
                observed.observe(len(tree.tokens), (t3 - t2) * 1e3)
            cache.commit(acc.path)
            if drafter is not None:
                for seen in (views(shaped, acc, out) if shaped else [(acc, drafted, out)]):
                    drafter.update(*seen)
            if rec is not None:
                rec.step(out, acc.path, acc.tokens)
            t4 = time.perf_counter()
            stats.draft_s += (t2 - t1) + (t4 - t3)
            stats.verify_s += t3 - t2
            stats.target_forwards += 1
            forced = shaped.forced(acc.path) if shaped else 0
            stats.proposed += drafted.num_drafted  # the drafter's own (cut ones too)
            stats.accepted += acc.num_accepted - forced
            stats.forced += forced
            if drafter is not None:
                (stats.accepted_prediction_tokens,
                 stats.rejected_prediction_tokens) = drafter.prediction_tokens()
            lps = None if top is None else token_logprobs(
                out.logits[mx.array(acc.path)], acc.tokens, top)
            if ruled:
                ruled.commit(_through_eos(acc.tokens, eos))
            step, used = self._emit(acc, tree, eos, text, max_new - done,
                                    bool(ruled) and ruled.finished(), lps, d.cancelled)
            done += len(acc.tokens)
            stats.generated_tokens += used
            root = acc.tokens[-1]
            seq.extend(acc.tokens)
            stats.decode_s = time.perf_counter() - t_start
            stats.peak_memory_mb = mx.get_peak_memory() / 2**20
            yield step
            if step.finish_reason is not None:
                return

    def _emit(self, acc: Accepted, tree: DraftTree, eos, text: TextStream, room: int,
              ended: bool = False, logprobs: list[TokenLogprob] | None = None,
              cancelled: bool = False) -> tuple[Step, int]:
        """Turn committed tokens into a Step, cutting at EOS, a stop string, the token limit
        (``room`` tokens were left), the rules' end (``ended``) or a cancel; the last step's
        text is flushed. ``logprobs`` (one per committed token) are cut like the tokens.

        Also returns how many tokens the output used (the kept ones, plus an EOS that ended it):
        tokens committed after the end do not count in the stats.
        """
        kept, reason, used = [], None, 0
        for i, t in enumerate(acc.tokens[:room]):
            used += 1
            if t in eos:
                reason = "stop"
                break
            kept.append(t)
            if text.add(t, drafted=i < acc.num_accepted):
                reason = "stop"
                break
        if reason is None and ended:
            reason = "stop"
        if reason is None and len(acc.tokens) >= room:
            reason = "length"
        if reason is None and cancelled:
            reason = "cancelled"
        segments = text.take() if reason is None else text.flush()
        drafted = min(len(kept), acc.num_accepted)
        lps = None if logprobs is None else logprobs[: len(kept)]
        return Step(kept, segments, drafted, tree.num_drafted, reason, lps), used


@dataclass
class _Held:
    """What a decoding leaves for the prefix store: the tokens its cache holds the KV of (but
    the last), whether a forward it asked for is unanswered, and whether a pipelined forward
    could not be rolled back."""

    seq: list[int] | None = None
    asked: bool = False
    lost: bool = False


def _through_eos(tokens: list[int], eos) -> list[int]:
    """``tokens`` up to and including the first EOS (nothing after it is generated)."""
    end = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
    return tokens[:end]
