"""The decode loop: draft, score the tree in one target pass, verify, commit; repeat.

Contract: for any drafter, the committed tokens are exactly what target-only decoding would
produce (greedy) or are distributed exactly as it (sampling) — the drafter only changes how many
target forwards it takes. The engine owns the target's KV cache; drafters own theirs. Plain
decoding is the same loop with a one-node tree, so the baseline shares every code path.

Phases of one step (named closures in ``Engine._decode``):
  1. ``propose``  drafter -> DraftTree (root = last committed token, not yet in the cache)
  2. ``score``    ``Target.score``: one target forward over all tree nodes -> logits per node
                  (only the upper layers when the drafter ran the lower ones: ``LowerLayers``)
  3. ``accept``   ``verify.accept``: a lossless rule picks the accepted path and the bonus token
  4. ``commit``   the cache keeps the accepted path; the drafter learns the outcome
  5. ``emit``     new tokens -> text delta, stop conditions, a Step event
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import mlx.core as mx

from .config import GenerationConfig, SamplingConfig
from .drafters.base import Drafter
from .errors import CacheRollbackError, ConfigError, ContextOverflowError
from .targets.lower_layers import LowerLayers
from .targets.target import Target, TargetOutput
from .sampling import make_rng
from .stream_text import TextStream
from .tree import DraftTree
from .verify import Accepted, accept

_PREFILL_CHUNK = 512


@dataclass
class Step:
    """One engine step's output."""

    token_ids: list[int]  # newly committed tokens (EOS and anything past a stop excluded)
    text: str  # the text they complete (held back while it could be the start of a stop string)
    accepted: int  # how many of token_ids were drafted and accepted
    proposed: int  # how many tokens the drafter proposed this step
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" on the last step


@dataclass
class Stats:
    method: str = "none"
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV was reused from the previous request
    generated_tokens: int = 0
    target_forwards: int = 0
    proposed: int = 0
    accepted: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    peak_memory_mb: float = 0.0

    @property
    def tau(self) -> float:
        """Tokens committed per target forward, counting the bonus token (plain decoding: 1)."""
        return self.generated_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(tau=self.tau, acceptance_rate=self.acceptance_rate, tokens_per_s=self.tokens_per_s)
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in d.items()}


@dataclass
class Result:
    text: str
    token_ids: list[int]
    stats: Stats
    finish_reason: str = "length"
    steps: list[Step] = field(default_factory=list, repr=False)


class Engine:
    """Speculative generation with one target and (optionally) one drafter.

    ``drafter=None`` is plain decoding. ``generate`` returns a :class:`Result`; ``stream`` yields
    :class:`Step` events and leaves the final :class:`Stats` in ``engine.last_stats``.
    """

    def __init__(self, target: Target, drafter: Drafter | None = None,
                 sampling: SamplingConfig | None = None, reuse_prefix: bool = True):
        self.target = target
        self.reuse_prefix = reuse_prefix
        self._cache = None  # the last request's KV cache ...
        self._cache_seq: list[int] = []  # ... which holds the KV of these tokens but the last
        self.drafter = drafter
        self.sampling = sampling or SamplingConfig()
        self.last_stats = Stats()
        self._cancel = False

    @property
    def method(self) -> str:
        return self.drafter.name if self.drafter else "none"

    def cancel(self) -> None:
        """Ask a running ``stream`` to stop after its current step (thread-safe flag)."""
        self._cancel = True

    def encode(self, prompt) -> list[int]:
        """A str is raw text; a list of {role, content} dicts goes through the chat template."""
        tok = self.target.tokenizer
        if isinstance(prompt, str):
            ids = tok.encode(prompt)
        elif isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt) and prompt:
            ids = tok.encode(tok.apply_chat_template(prompt), add_special_tokens=False)
        elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        else:
            raise ConfigError(f"prompt must be a string, a list of chat messages or token ids; "
                              f"got {type(prompt).__name__}")
        if not ids or (isinstance(prompt, str) and not prompt.strip()):
            raise ConfigError("prompt is empty; give some text to continue")
        return ids

    def generate(self, prompt, **kwargs) -> Result:
        steps = list(self.stream(prompt, **kwargs))
        ids = [t for s in steps for t in s.token_ids]
        reason = steps[-1].finish_reason if steps else "length"
        return Result("".join(s.text for s in steps), ids, self.last_stats, reason or "length", steps)

    def stream(self, prompt, *, max_tokens: int | None = None, stop=None,
               generation: GenerationConfig | None = None,
               sampling: SamplingConfig | None = None) -> Iterator[Step]:
        """Generate for ``prompt``, yielding a Step per target forward.

        ``sampling`` overrides the engine's SamplingConfig for this call (the drafter gets the
        same one). ``engine.drafter`` may be replaced between calls; the KV cache of a shared
        prompt prefix is reused across calls unless ``reuse_prefix=False``.
        """
        gen = generation or GenerationConfig(
            max_tokens=max_tokens if max_tokens is not None else 256, stop=tuple(stop or ()))
        ids = self.encode(prompt)
        ctx = self.target.context_length
        if len(ids) >= ctx:
            raise ContextOverflowError(
                f"prompt has {len(ids)} tokens but the context window of {self.target.name} "
                f"is {ctx}; shorten the prompt")
        self._cancel = False
        yield from self._decode(ids, min(gen.max_tokens, ctx - len(ids)), gen,
                                sampling or self.sampling)

    def _decode(self, ids: list[int], max_new: int, gen: GenerationConfig,
                cfg: SamplingConfig) -> Iterator[Step]:
        target, drafter = self.target, self.drafter
        cache, start = self._reuse(ids)
        stats = self.last_stats = Stats(method=self.method, prompt_tokens=len(ids), cached_tokens=start)
        rng = make_rng(cfg, stream=0)
        eos = self.target.tokenizer.eos_token_ids
        text = TextStream(self.target.tokenizer, gen.stop)
        mx.reset_peak_memory()

        lower = None
        if drafter is not None and drafter.lower_layers:  # it drafts through the target's layers
            lower = LowerLayers(target, cache, drafter.lower_layers)

        def prefill() -> None:
            for a in range(start, len(ids) - 1, _PREFILL_CHUNK):
                target.score(ids[a : min(a + _PREFILL_CHUNK, len(ids) - 1)], cache, head=False)
                cache.commit()
                mx.eval(cache.state())
            if drafter is not None:
                if drafter.lower_layers:
                    drafter.use_lower_layers(lower)
                drafter.prefill(ids, None, cfg)

        def propose(root: int, budget: int) -> DraftTree:
            if drafter is None or budget <= 0:
                return DraftTree.chain(root, [])
            if lower is not None:
                lower.begin(budget + 1)
            tree = drafter.propose(budget)
            assert tree.tokens[0] == root, "drafter proposed a tree with the wrong root"
            return tree

        def score(tree: DraftTree) -> TargetOutput:
            if lower is not None and lower.fed:
                return lower.score(tree)  # the drafter ran the lower layers: the rest only
            return target.score(tree, cache)

        t0 = time.perf_counter()
        prefill()
        stats.prefill_s = time.perf_counter() - t0
        root, done = ids[-1], 0
        seq = self._cache_seq = list(ids)  # the cache holds the KV of seq[:-1]
        t_start = time.perf_counter()
        while True:
            t1 = time.perf_counter()
            tree = propose(root, max_new - done - 1)
            t2 = time.perf_counter()
            out = score(tree)
            acc, _ = accept(tree, out.logits, cfg, rng)
            t3 = time.perf_counter()
            cache.commit(acc.path)
            if drafter is not None:
                drafter.update(acc, tree, out)
            t4 = time.perf_counter()
            stats.draft_s += (t2 - t1) + (t4 - t3)
            stats.verify_s += t3 - t2
            stats.target_forwards += 1
            stats.proposed += tree.num_drafted
            stats.accepted += acc.num_accepted
            step, used = self._emit(acc, tree, eos, text, max_new - done)
            done += len(acc.tokens)
            stats.generated_tokens += used
            root = acc.tokens[-1]
            seq.extend(acc.tokens)
            if step.finish_reason is None and done >= max_new:
                step.finish_reason = "length"
            if step.finish_reason is None and self._cancel:
                step.finish_reason = "cancelled"
            if step.finish_reason is not None:
                step.text += text.flush()
            stats.decode_s = time.perf_counter() - t_start
            stats.peak_memory_mb = mx.get_peak_memory() / 2**20
            yield step
            if step.finish_reason is not None:
                return

    def _reuse(self, ids: list[int]) -> tuple:
        """The previous request's cache trimmed to the prefix it shares with ``ids``, or a new one.

        Returns (cache, number of prompt tokens whose KV is already in it).
        """
        cache, seq = self._cache, self._cache_seq
        self._cache, self._cache_seq = None, []  # an interrupted prefill must not look reusable
        if self.reuse_prefix and cache is not None and cache.length == len(seq) - 1:
            common = 0
            for a, b in zip(seq[:-1], ids[:-1]):
                if a != b:
                    break
                common += 1
            try:
                cache.trim(cache.length - common)
            except CacheRollbackError:
                common = -1
            if common > 0:
                self._cache = cache
                return cache, common
        self._cache = self.target.make_cache()
        return self._cache, 0

    def _emit(self, acc: Accepted, tree: DraftTree, eos, text: TextStream,
              room: int) -> tuple[Step, int]:
        """Turn committed tokens into a Step, cutting at EOS, a stop string or the token limit.

        Also returns how many tokens the output used (the kept ones, plus an EOS that ended it):
        tokens committed after the end do not count in the stats.
        """
        kept, reason, used = [], None, 0
        for t in acc.tokens[:room]:
            used += 1
            if t in eos:
                reason = "stop"
                break
            kept.append(t)
            if text.add(t):
                reason = "stop"
                break
        drafted = min(len(kept), acc.num_accepted)
        return Step(kept, text.take(), drafted, tree.num_drafted, reason), used
