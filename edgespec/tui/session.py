"""A chat conversation run on the generation worker (``worker.Worker``), independent of any UI.

Contract:

- The model, its engine and all MLX work live on one :class:`~edgespec.worker.Worker`, the
  thread the server and the Python API run on; it runs the session's turns and checks one at a
  time, in order. :class:`ChatSession` holds the message history and what a person may change
  mid-conversation (method, temperature); the setters and :meth:`ChatSession.stop` only record
  what happens next, so any thread may call them.
- A turn is one worker job. :meth:`ChatSession.reply` (blocking: line mode) and
  :meth:`ChatSession.areply` (asyncio: the Textual app, in batches, one redraw each) yield
  :class:`Update` events whose segments (the engine's ``Step.segments``) say which text came from
  accepted drafts and which the target produced itself. :meth:`ChatSession.stop` ends the turn
  after its current step, or before it starts. The answer, even a stopped one, joins the history.
- A method switch is checked on the worker before the next turn (:meth:`ChatSession.prepare`:
  its drafter built once, loading what it needs and reporting one-time measurements); if that
  fails, the previous method stays. Each turn then gets a fresh drafter, as every worker job does.
- Each turn sends the whole history through the model's chat template; the worker's engine
  reuses the KV cache of the prefix shared with the previous turn, so earlier turns are not read
  again (``Update.stats.cached_tokens`` says how many prompt tokens were reused).
- Sampling (``open_session``): the flags given, over the model's own settings
  (``generation_defaults.model_sampling``), over the chat's defaults (``generation_defaults.CHAT``).
- The plain-decoding rate is known once a warm turn (not the session's first generation, which
  pays one-time costs) ran with method ``none`` for at least 16 tokens, or after
  :meth:`ChatSession.measure_plain`; from then on updates carry the speedup against it. It is an
  indication (short runs, different prompts); ``edgespec bench`` is the measurement.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping

from .. import options
from ..config import GenerationConfig, SamplingConfig, SpecConfig
from ..drafters import make_drafter, registry
from ..drafters.default import method_for_model
from ..engine import Engine, Step
from ..errors import ConfigError
from ..generation_defaults import model_sampling
from ..prompt import check_context, encode_prompt
from ..stats import Stats
from ..stream_text import Segment
from ..targets import Target
from ..targets.cost import reporting
from ..worker import Done, Event, Failed, GenRequest, Job, Live, LoopJob, ThreadJob, Worker, loader

_MIN_PLAIN_TOKENS = 16  # a plain turn shorter than this gives no usable rate
_MEASURE_PROMPT = [{"role": "user", "content": "Write two sentences about the sea."}]
Status = Callable[[str], None]


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


@dataclasses.dataclass
class _Turn:
    """One answer as it arrives: its text, and whether the worker finished it."""

    answer: list[str] = dataclasses.field(default_factory=list)
    stats: Stats | None = None  # the final stats, once done
    ended: bool = False  # the last update carried a finish reason


class ChatSession:
    """A multi-turn conversation with the worker's target and a switchable drafter."""

    def __init__(self, worker: Worker, *, spec: SpecConfig | None = None,
                 sampling: SamplingConfig | None = None,
                 generation: GenerationConfig | None = None, system: str | None = None,
                 sampling_origin: str = "given"):
        self.worker = worker
        self.target: Target = worker.target
        self.spec = spec or SpecConfig()
        self.sampling = sampling or SamplingConfig()
        self.sampling_origin = sampling_origin  # where the sampling settings came from
        self.generation = generation or GenerationConfig()
        self.system = system
        self.method = self.spec.method
        self._checked: str | None = None  # the last method whose drafter was built on the worker
        self._stop = threading.Event()
        self._job: Job | None = None
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
        """Ask the running (or next) turn to end after its current step (safe from any thread)."""
        self._stop.set()
        job = self._job
        if job is not None:
            job.cancel()

    def close(self) -> None:
        """Stop the turn in flight and the worker (which releases its MLX state)."""
        self.stop()
        self.worker.stop()

    # checks and measurements, run on the worker ------------------------------------------------

    def prepare(self, status: Status = lambda _: None) -> None:
        """Build the drafter of ``self.method`` once on the worker if it changed (see the module
        docstring); the previous method stays if that fails."""
        method = self.method
        if method == self._checked:
            return
        try:
            self.worker.call(self._build(method, status))
        except Exception:
            self.method = self._checked or method  # keep the session usable with the last one
            raise
        self._checked = method

    async def aprepare(self, status: Status = lambda _: None) -> None:
        """``prepare`` for asyncio."""
        method = self.method
        if method == self._checked:
            return
        try:
            await self.worker.acall(self._build(method, status))
        except Exception:
            self.method = self._checked or method
            raise
        self._checked = method

    def _spec(self, method: str) -> SpecConfig:
        return options.spec_for(method, dataclasses.asdict(self.spec))

    def _build(self, method: str, status: Status) -> Callable[[Engine], None]:
        spec, sampling, draft = self._spec(method), self.sampling, self.worker.draft

        def build(engine: Engine) -> None:
            with reporting(status):  # the verify-cost curve's first measurement, if it comes
                make_drafter(spec, engine.target, sampling, draft=draft)

        return build

    def measure_plain(self, max_tokens: int = 32) -> float:
        """Measure plain decoding on a short fixed prompt, without touching the conversation."""
        return self._rate(self.worker.call(self._measure(max_tokens)))

    async def ameasure_plain(self, max_tokens: int = 32) -> float:
        """``measure_plain`` for asyncio."""
        return self._rate(await self.worker.acall(self._measure(max_tokens)))

    def _measure(self, max_tokens: int) -> Callable[[Engine], Stats]:
        def measure(engine: Engine) -> Stats:
            plain = Engine(engine.target, None, SamplingConfig(), reuse_prefix=False)
            if not self._warm:
                plain.generate(_MEASURE_PROMPT, max_tokens=4)
                self._warm = True
            return plain.generate(_MEASURE_PROMPT, max_tokens=max_tokens).stats

        return measure

    def _rate(self, stats: Stats | None) -> float:
        if stats is not None and stats.generated_tokens:
            self.plain_rate = stats.tokens_per_s
        return self.plain_rate or 0.0

    # turns -------------------------------------------------------------------------------------

    def reply(self, text: str) -> Iterator[Update]:
        """Answer the user message ``text``, waiting on this thread."""
        self.prepare()
        turn, job = _Turn(), ThreadJob(self._request(text))
        try:
            self._submit(job)
            for event in self.worker.events_blocking(job):
                if (update := self._take(event, turn)) is not None:
                    yield update
        finally:
            self._end(job, turn)

    async def areply(self, text: str,
                     status: Status = lambda _: None) -> AsyncIterator[list[Update]]:
        """Answer the user message ``text`` on the running event loop: batches of updates, each
        all that had arrived when the loop got to it (``status`` gets a method check's lines)."""
        await self.aprepare(status)
        turn, job = _Turn(), LoopJob(self._request(text), asyncio.get_running_loop())
        try:
            self._submit(job)
            async for events in self.worker.batches(job):
                yield [u for e in events if (u := self._take(e, turn)) is not None]
        finally:
            self._end(job, turn)

    def _request(self, text: str) -> GenRequest:
        """The turn's request; the message joins the history (``_end`` removes it again if
        nothing was answered)."""
        self.messages.append({"role": "user", "content": text})
        try:
            ids = encode_prompt(self.target.tokenizer, self.messages)
            check_context(ids, self.target.context_length, self.target.name)
        except Exception:
            self.messages.pop()
            raise
        return GenRequest(ids, self.generation, self.sampling, self._spec(self.method),
                          live_stats=True)

    def _submit(self, job: Job) -> None:
        self._job = job
        if self._stop.is_set():  # a stop that came before the turn began
            job.cancel()
        self.worker.submit(job)

    def _take(self, event: Event, turn: _Turn) -> Update | None:
        """The update an event makes (None: nothing to show); a failure is raised here."""
        if isinstance(event, Failed):
            raise event.error
        if isinstance(event, Live):
            step: Step = event.step
            turn.answer.append(step.text)
            turn.ended = step.finish_reason is not None
            return Update(step.segments, event.stats, self._speedup(event.stats),
                          step.finish_reason)
        if isinstance(event, Done):
            turn.stats = event.stats
            if not turn.ended:  # cancelled: no step said so
                return Update((), event.stats, self._speedup(event.stats), event.finish_reason)
        return None

    def _end(self, job: Job, turn: _Turn) -> None:
        job.cancel()  # a reader that left early ends the job (no-op once it is done)
        self._job = None
        self._stop.clear()  # cleared here, not at the start: a stop may come before that
        if turn.answer or turn.stats is not None:
            self.messages.append({"role": "assistant", "content": "".join(turn.answer)})
        else:
            self.messages.pop()  # nothing was said: forget the question too
        if turn.stats is not None:
            self._note_plain_rate(turn.stats)

    def _speedup(self, stats: Stats) -> float | None:
        if self.plain_rate and stats.method != "none" and stats.tokens_per_s:
            return stats.tokens_per_s / self.plain_rate
        return None

    def _note_plain_rate(self, stats: Stats) -> None:
        if stats.method == "none" and stats.generated_tokens >= _MIN_PLAIN_TOKENS and self._warm:
            self.plain_rate = stats.tokens_per_s
        self._warm = True


# opening a session -------------------------------------------------------------------------------

def chat_sampling(given: Mapping | SamplingConfig | None,
                  target: Target) -> tuple[SamplingConfig, str]:
    """The chat's sampling: ``given`` (the flags; a SamplingConfig gives every field) over the
    model's own settings over the chat's defaults, and where the settings not given came from."""
    if isinstance(given, SamplingConfig):
        return given, "given"
    model = model_sampling(target.path)
    values = options.pick(SamplingConfig, options.values("chat", given or {}, model=model))
    origin = "the model's generation_config.json" if model else "the chat's defaults"
    return SamplingConfig(**values), origin


def start_worker(model: str | Target, draft: str | None = None, dtype: str | None = None,
                 status: Status = lambda _: None, learning=None) -> Worker:
    """A worker loading ``model`` (and the draft model) on its thread; returns at once.
    ``learning``: the worker's ``learn.session.Learning`` (None: nothing is recorded)."""
    load = loader(model, draft, dtype, progress=True)

    def load_saying() -> tuple[Target, Target | None]:
        status(f"loading {model}…" + (f" and draft model {draft}…" if draft else ""))
        return load()

    worker = Worker(load_saying, learning=learning).start(wait=False)
    # a session never closed (or the app left while loading) ends its thread, releasing MLX,
    # before the process exits: waiting for a load in progress, as the load cannot be stopped
    atexit.register(worker.stop, None)
    return worker


def _opening(worker: Worker, spec: SpecConfig, sampling: Mapping | SamplingConfig | None,
             generation: GenerationConfig, system: str | None, method_named: bool,
             status: Status) -> Callable[[Engine], ChatSession]:
    """What opening runs on the worker once the model is loaded: the method (unless named: the
    interactive default for the model), the sampling settings, the first drafter built."""

    def open_on_worker(engine: Engine) -> ChatSession:
        chosen = method_for_model(spec, method_named, engine.target)
        config, origin = chat_sampling(sampling, engine.target)
        session = ChatSession(worker, spec=chosen, sampling=config, generation=generation,
                              system=system, sampling_origin=origin)
        session._build(chosen.method, status)(engine)
        session._checked = chosen.method
        if worker.learning is not None and worker.learning.recorder is not None:
            status(f"learning on: recording to {worker.learning.recorder.store.folder} "
                   "(this machine only; --no-learn turns it off)")
        return session

    return open_on_worker


def open_session(model: str | Target, *, spec: SpecConfig, generation: GenerationConfig,
                 sampling: Mapping | SamplingConfig | None = None, system: str | None = None,
                 dtype: str | None = None, method_named: bool = True,
                 status: Status = lambda _: None, learning=None) -> ChatSession:
    """Load ``model`` (and the draft model) on a new worker into a ready session, waiting.
    ``sampling``: the sampling options given (flags; see ``chat_sampling``); unless
    ``method_named``, the method is the interactive default for the loaded model.
    ``session.close()`` stops the worker."""
    worker = start_worker(model, spec.draft, dtype, status, learning)
    try:
        return worker.call(_opening(worker, spec, sampling, generation, system, method_named,
                                    status))
    except BaseException:
        worker.stop()
        raise


async def aopen_session(model: str | Target, *, spec: SpecConfig, generation: GenerationConfig,
                        sampling: Mapping | SamplingConfig | None = None,
                        system: str | None = None, dtype: str | None = None,
                        method_named: bool = True,
                        status: Status = lambda _: None, learning=None) -> ChatSession:
    """``open_session`` for asyncio: the event loop runs on while the model loads."""
    worker = start_worker(model, spec.draft, dtype, status, learning)
    try:
        return await worker.acall(_opening(worker, spec, sampling, generation, system,
                                           method_named, status))
    except BaseException:
        worker.stop()
        raise
