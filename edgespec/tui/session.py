"""A chat conversation over one Engine, independent of any user interface.

Contract:

- :class:`ChatSession` owns the engine, the message history and the settings a person may change
  mid-conversation (method, temperature). Everything that touches the engine (loading, building a
  drafter, generating) must run on one thread at a time: the engine is not thread-safe. Other
  threads may call :meth:`ChatSession.stop` and the setters (``set_method``, ``set_temperature``),
  which only record what the next turn will use.
- :class:`EngineThread` is that one thread for an app: MLX streams belong to the thread that made
  them, and MLX 0.32 can abort the process at exit unless each thread that ran MLX releases its
  streams (``mx.clear_streams()``) before it ends; :meth:`EngineThread.close` does that.
- :meth:`ChatSession.reply` yields :class:`Update` events whose segments (the engine's
  ``Step.segments``) say which text came from accepted drafts and which the target produced
  itself (the bonus / corrected token).
- Each turn sends the whole history through the model's chat template; the engine reuses the KV
  cache of the prefix shared with the previous turn, so earlier turns are not read again
  (``Update.stats.cached_tokens`` says how many prompt tokens were reused).
- The plain-decoding rate is known once a warm turn (not the session's first generation, which
  pays one-time costs) ran with method ``none`` for at least 16 tokens, or after
  :meth:`ChatSession.measure_plain`; from then on updates carry the speedup against it. It is an
  indication (short runs, different prompts); ``edgespec bench`` is the measurement.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import mlx.core as mx

from ..config import GenerationConfig, SamplingConfig, SpecConfig
from ..drafters import load_draft, make_drafter, registry
from ..engine import Engine
from ..errors import ConfigError
from ..options import method_for_model, spec_for
from ..stats import Stats
from ..stream_text import Segment
from ..targets import Target, load
from ..targets.cost import reporting

_MIN_PLAIN_TOKENS = 16  # a plain turn shorter than this gives no usable rate
_MEASURE_PROMPT = [{"role": "user", "content": "Write two sentences about the sea."}]


@dataclasses.dataclass(frozen=True)
class Update:
    """What one engine step adds to the answer, with a snapshot of the running stats."""

    segments: tuple[Segment, ...]
    stats: Stats
    speedup: float | None = None  # tokens/s against the plain-decoding rate, when known
    finish_reason: str | None = None


def merge_segments(segments) -> list[Segment]:
    """Adjacent runs of the same kind joined into one."""
    out: list[Segment] = []
    for p in segments:
        if out and out[-1].drafted == p.drafted:
            out[-1] = Segment(out[-1].text + p.text, p.drafted)
        elif p.text:
            out.append(p)
    return out


class ChatSession:
    """A multi-turn conversation with one target and a switchable drafter."""

    def __init__(self, target: Target, *, spec: SpecConfig | None = None,
                 sampling: SamplingConfig | None = None,
                 generation: GenerationConfig | None = None, system: str | None = None,
                 draft: Target | None = None):
        self.target = target
        self.spec = spec or SpecConfig()
        self.sampling = sampling or SamplingConfig()
        self.generation = generation or GenerationConfig()
        self.system = system
        self._draft = draft  # the draft model, loaded on first use of a method that uses it
        self.engine = Engine(target, None, self.sampling)
        self.method = self.spec.method
        self._built: str = "none"  # the method engine.drafter was built for
        self._stop = threading.Event()
        self.messages: list[dict] = []
        self.plain_rate: float | None = None
        self._warm = False  # has the target generated in this process yet?
        self.new_conversation()

    # settings: take effect at the next turn ------------------------------------------------

    @property
    def methods(self) -> list[str]:
        """Methods this session can switch to (those needing a draft model only with --draft,
        those needing a trained head only when one exists for the model)."""
        return list(registry.available(self.spec.draft, registry.heads_for(self.target, self.spec.head)))

    def set_method(self, method: str) -> None:
        if method not in self.methods:
            hint = (f" (start with --draft REF to use {method!r})"
                    if method in registry.NAMES and registry.get(method).needs_draft else "")
            raise ConfigError(f"unknown method {method!r}; choose one of: "
                              f"{', '.join(self.methods)}{hint}")
        self.method = method

    def set_temperature(self, temperature: float) -> None:
        self.sampling = dataclasses.replace(self.sampling, temperature=temperature)

    def new_conversation(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def stop(self) -> None:
        """Ask the running reply to end after its current step (safe from any thread)."""
        self._stop.set()
        self.engine.cancel()

    # engine work: one thread at a time ------------------------------------------------------

    def prepare(self, status: Callable[[str], None] = lambda _: None) -> None:
        """Build the drafter for ``self.method`` if it changed (loads the draft model once)."""
        if self.method == self._built:
            return
        method = self.method
        uses_draft = registry.get(method).uses_draft(self.spec.draft)
        try:
            if uses_draft and self._draft is None:
                status(f"loading draft model {self.spec.draft}…")
                self._draft = load_draft(self.spec.draft, self.target)
            spec = spec_for(method, dataclasses.asdict(self.spec))
            with reporting(status):  # the verify-cost curve's first measurement, if it comes
                self.engine.drafter = make_drafter(spec, self.target, self.sampling,
                                                   draft=self._draft if uses_draft else None)
        except Exception:
            self.method = self._built  # keep the session usable with the previous method
            raise
        self._built = method

    def reply(self, text: str) -> Iterator[Update]:
        """Answer the user message ``text``; the answer (even a stopped one) joins the history."""
        self.prepare()
        self.messages.append({"role": "user", "content": text})
        answer, finished = [], False
        try:
            for step in self.engine.stream(self.messages, generation=self.generation,
                                           sampling=self.sampling):
                if self._stop.is_set() and step.finish_reason is None:
                    self.engine.cancel()  # also covers a stop that came before the stream began
                answer.append(step.text)
                yield self._update(step.segments, step.finish_reason)
            finished = True
        finally:
            self._stop.clear()  # cleared here, not at the start: a stop may come before that
            if answer or finished:
                self.messages.append({"role": "assistant", "content": "".join(answer)})
            else:
                self.messages.pop()  # nothing was said: forget the question too
        self._note_plain_rate(self.engine.last_stats)

    def measure_plain(self, max_tokens: int = 32) -> float:
        """Measure plain decoding on a short fixed prompt, without touching the conversation."""
        engine = Engine(self.target, None, SamplingConfig(), reuse_prefix=False)
        if not self._warm:
            engine.generate(_MEASURE_PROMPT, max_tokens=4)
            self._warm = True
        stats = engine.generate(_MEASURE_PROMPT, max_tokens=max_tokens).stats
        if stats.generated_tokens:
            self.plain_rate = stats.tokens_per_s
        return self.plain_rate or 0.0

    def _update(self, segments, finish_reason) -> Update:
        stats = copy.copy(self.engine.last_stats)
        speedup = None
        if self.plain_rate and stats.method != "none" and stats.tokens_per_s:
            speedup = stats.tokens_per_s / self.plain_rate
        return Update(segments, stats, speedup, finish_reason)

    def _note_plain_rate(self, stats: Stats) -> None:
        if stats.method == "none" and stats.generated_tokens >= _MIN_PLAIN_TOKENS and self._warm:
            self.plain_rate = stats.tokens_per_s
        self._warm = True


def open_session(model_ref: str, *, spec: SpecConfig, sampling: SamplingConfig,
                 generation: GenerationConfig, system: str | None = None,
                 dtype: str | None = None, method_named: bool = True,
                 status: Callable[[str], None] = lambda _: None) -> ChatSession:
    """Load the target (and the draft model when the method needs it) into a ready session;
    unless ``method_named``, the method is the interactive default for the loaded model."""
    status(f"loading {model_ref}…")
    target = load(model_ref, dtype=dtype, progress=True)
    spec = method_for_model(spec, method_named, target)
    session = ChatSession(target, spec=spec, sampling=sampling, generation=generation,
                          system=system)
    session.prepare(status)
    return session


class EngineThread:
    """One long-lived thread for all MLX work of an app (see the module docstring)."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgespec-engine")

    async def run(self, fn: Callable, *args):
        """Run ``fn(*args)`` on the engine thread and wait for it without blocking the loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, partial(fn, *args))

    def close(self) -> None:
        """Wait for the running work (stop it first), release the thread's MLX streams, end it."""
        self._pool.submit(mx.clear_streams)
        self._pool.shutdown(wait=True)
