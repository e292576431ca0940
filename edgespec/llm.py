"""The Python API for apps: ``llm = edgespec.load(model, **options)``, then ``llm.chat(...)``.

Contract:
- An :class:`LLM` owns one model and one generation thread (``worker.Worker``, the server's):
  every call is queued to it, so one LLM may be shared by threads and asyncio tasks.
  Concurrent calls (threads, ``achat`` tasks gathered, ``chat_many``) decode together, up to
  ``max_concurrency`` at once (``load``'s argument, default 4), sharing each target forward
  (``batch.py``); each still gets exactly its own output (greedy: the tokens it gets alone;
  seeded sampling: the same tokens whatever runs beside it).
- The keyword options are the config fields (``config.py``), taken through ``options.py`` like
  the CLI's flags and the server's request fields: given to ``load`` they are every call's
  defaults, given to a call they apply to that call. They are validated on the caller's thread
  before anything is queued; a bad name or value raises :class:`ConfigError` naming it and
  what is allowed. A sampling option given to neither defaults to the model's own setting
  (its generation_config.json, ``generation_defaults.py``), else to greedy. Speculation is
  lossless: options change the speed, never the output (except the sampling and stop options,
  which say what to generate).
- ``chat`` takes chat messages (a str is one user message) and applies the model's chat
  template; ``complete`` continues raw text (or token ids). ``stream`` / ``astream`` yield the
  steps as they come (``raw=True``: like ``complete``); ``achat`` / ``acomplete`` are awaitable.
- Multi-turn: send the whole conversation each time. The engine keeps finished calls' KV caches
  (``prefix_store``) and computes only what follows the longest prefix one of them shares
  (``result.stats.cached_tokens``).
- ``prediction=`` (a call option): the text the answer is expected to mostly be (an edited
  file), or OpenAI's ``{"type": "content", ...}``; it drafts while the answer follows it
  (``drafters/prediction.py``), the output is unchanged, and ``result.stats`` counts the
  accepted and rejected prediction tokens.
- ``response_format=`` (a call option): structured output, enforced by a grammar
  (``grammar.py``) with every method, output unchanged by speculation: OpenAI's
  ``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {"name", "schema",
  "strict"}}``, or a pydantic model class, with which ``chat`` / ``achat`` / ``complete`` return
  an instance of it (parsed from the answer) instead of a Result.
- ``suffix=`` (an option of ``complete``): fill in the middle. The text is the code before the
  hole, ``suffix`` the code after it; the prompt is built in the model's own FIM format
  (``fim.py``); a model without FIM tokens raises ConfigError.
- ``logprobs=N`` (a call option, 0-20): each step and ``result.logprobs`` carry every token's
  log-probability under the model's raw distribution and its N likeliest alternatives
  (``logprobs.py``); the same values whatever the method.
- Cancelling (``Stream.cancel()``, ``LLM.cancel()``, leaving a loop, cancelling a task) ends a
  call after its current step and leaves the cache consistent; see ``streams.py``.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from dataclasses import replace
from typing import Any, Union

import pydantic

from . import options
from .config import GenerationConfig, ModelConfig, SamplingConfig, SpecConfig
from .drafters import registry
from .drafters.default import interactive_method
from .engine import Result
from .errors import ConfigError, GrammarError
from .fim import encode_fim, fim_format
from .generation_defaults import model_sampling
from .grammar import Grammar, check_stop, from_response_format
from .learn.flags import learning_from
from .logprobs import check_top
from .prompt import check_context, encode_prediction, encode_prompt
from .streams import AsyncStream, Stream
from .targets import Target
from .worker import GenRequest, Job, LoopJob, ThreadJob, Worker, loader

Messages = Union[str, list[dict[str, str]]]
"""Chat input: a list of ``{"role": ..., "content": ...}`` messages, or one user message as a str."""
Text = Union[str, list[int]]
"""Raw input: text to continue, or token ids."""


class LLM:
    """A loaded model that answers chats and continues text, with speculative decoding.

    Make one with :func:`edgespec.load` (or ``LLM(target, **options)`` for a :class:`Target`
    already loaded). Close it with :meth:`close` or a ``with`` block; it is also closed when it is
    garbage collected and at interpreter exit.
    """

    def __init__(self, model: str | Target = "demo", *, progress: bool = True,
                 max_concurrency: int = 4, learn: bool = False, **kw: Any) -> None:
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) \
                or max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
        if not isinstance(learn, bool):
            raise ConfigError(f"learn must be True or False, got {learn!r}")
        given = options.checked("python", kw)
        self._defaults = options.values("python", given)
        dtype = ModelConfig(model if isinstance(model, str) else "loaded",
                            self._defaults.get("dtype")).dtype
        self._configs({})  # a bad method or other option fails here, before anything is loaded
        load = loader(model, self._defaults.get("draft"), dtype, progress)
        self._worker = Worker(load, max_concurrency=max_concurrency, max_queue=1 << 30,
                              learning=learning_from("api", learn is True)).start()
        self._jobs: weakref.WeakSet[Job] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closer = weakref.finalize(self, _close, self._worker, self._jobs, self._lock)
        if "method" not in given:  # the interactive default, now that the model is known
            try:
                method = interactive_method(self._defaults.get("draft"), self.target,
                                            self._defaults.get("head"))
            except BaseException:
                self._closer()  # a head that does not fit: stop the worker, then say why
                raise
            self._defaults = {**self._defaults, "method": method}
        # the model's own sampling settings (generation_config.json), under load's options
        self._defaults = {**model_sampling(self.target.path), **self._defaults}

    # -- what it is -----------------------------------------------------------------------------

    @property
    def target(self) -> Target:
        """The loaded model (its ``tokenizer``, ``name``, ``context_length``). Run it yourself
        only through an ``Engine`` of your own, and not while a call of this LLM is running."""
        assert self._worker.target is not None
        return self._worker.target

    @property
    def method(self) -> str:
        """The drafting method of calls that name none; assign a method name to switch."""
        return self._defaults["method"]

    @method.setter
    def method(self, name: str) -> None:
        self._spec(name, {})  # ConfigError for an unknown method, or one this LLM cannot run
        self._defaults = {**self._defaults, "method": name}

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods this LLM can run (``draft`` and ``cascade`` need ``load(..., draft=REF)``,
        ``eagle3``, ``medusa`` and ``corpus`` a trained head or corpus for the model)."""
        return registry.available(self._defaults.get("draft"),
                                  registry.heads_for(self.target, self._defaults.get("head")))

    def __repr__(self) -> str:
        return f"LLM({self.target.name!r}, method={self.method!r})"

    # -- calls ----------------------------------------------------------------------------------

    def chat(self, messages: Messages, **options: Any) -> Result:
        """The model's answer to ``messages`` (a str is one user message), as a :class:`Result`:
        ``text``, ``token_ids``, ``finish_reason`` ("stop", "length" or "cancelled"), ``stats``;
        with ``response_format=`` a pydantic model class, an instance of it."""
        return _parsed(options, self.stream(messages, **options).result())

    def chat_many(self, conversations: list[Messages], **options: Any) -> list:
        """``chat`` for each of ``conversations``, decoded together (up to ``max_concurrency``
        at once); the answers in the same order. Each is what ``chat`` alone returns."""
        if not isinstance(conversations, (list, tuple)):
            raise ConfigError(f"chat_many takes a list of conversations, got "
                              f"{type(conversations).__name__}")
        streams = [self.stream(c, **options) for c in conversations]
        return [_parsed(options, s.result()) for s in streams]

    def complete(self, text: Text, **options: Any) -> Result:
        """The continuation of raw ``text`` (or token ids), without the chat template."""
        return _parsed(options, self.stream(text, raw=True, **options).result())

    def stream(self, prompt: Messages | Text, *, raw: bool = False, **options: Any) -> Stream:
        """Run ``chat`` (``raw=True``: ``complete``) and yield its steps as they are generated;
        ``step.segments`` mark the text that came from accepted drafts."""
        job = ThreadJob(self._request(prompt, raw, options))
        return Stream(self._worker, self._submit(job), self)

    async def achat(self, messages: Messages, **options: Any) -> Result:
        """``chat`` for asyncio: the event loop keeps running while the model generates."""
        return _parsed(options, await self.astream(messages, **options).result())

    async def acomplete(self, text: Text, **options: Any) -> Result:
        """``complete`` for asyncio."""
        return _parsed(options, await self.astream(text, raw=True, **options).result())

    def astream(self, prompt: Messages | Text, *, raw: bool = False, **options: Any) -> AsyncStream:
        """``stream`` for asyncio: ``async for step in llm.astream(...)`` (inside a running loop)."""
        job = LoopJob(self._request(prompt, raw, options), asyncio.get_running_loop())
        return AsyncStream(self._worker, self._submit(job), self)

    def cancel(self) -> None:
        """Cancel every call of this LLM that is queued or running (safe from any thread)."""
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            job.cancel()

    def close(self) -> None:
        """Cancel the calls in flight, stop the generation thread and release its MLX state."""
        self._closer()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests -------------------------------------------------------------------------------

    def _request(self, prompt: Messages | Text, raw: bool, kw: dict) -> GenRequest:
        if "draft" in kw:
            raise ConfigError("draft is loaded once, with the model: edgespec.load(model, "
                              "draft=REF); a call chooses only the method")
        prediction = kw.pop("prediction", None)
        grammar = _grammar(kw.pop("response_format", None))
        logprobs = check_top(kw.pop("logprobs", None))
        suffix = kw.pop("suffix", None)
        spec, sampling, generation = self._configs(options.checked("call", kw))
        check_stop(grammar, generation.stop)
        if suffix:
            ids, generation = self._fim(prompt, suffix, raw, generation)
        else:
            ids = encode_prompt(self.target.tokenizer, _raw(prompt) if raw else _messages(prompt))
        check_context(ids, self.target.context_length, self.target.name)
        if prediction is not None:
            prediction = encode_prediction(self.target.tokenizer, prediction)
        return GenRequest(ids, generation, sampling, spec, prediction=prediction,
                          logprobs=logprobs, grammar=grammar)

    def _fim(self, prefix, suffix, raw: bool,
             generation: GenerationConfig) -> tuple[list[int], GenerationConfig]:
        """The fill-in-the-middle prompt (``fim.py``) and where the family's middle ends."""
        if not raw or not isinstance(prefix, str):
            raise ConfigError("suffix= (fill-in-the-middle) is an option of complete / stream(raw="
                              "True), whose text is the code before the hole; got "
                              f"{'a chat' if not raw else type(prefix).__name__}")
        ids = encode_fim(self.target.tokenizer, prefix, suffix, self.target.name)
        stop = fim_format(self.target.tokenizer).stop
        return ids, (replace(generation, stop=generation.stop + stop) if stop else generation)

    def _configs(self, call: dict) -> tuple[SpecConfig, SamplingConfig, GenerationConfig]:
        merged = {**self._defaults, **call}
        return (self._spec(merged["method"], call), options.config(SamplingConfig, merged),
                options.config(GenerationConfig, merged))

    def _spec(self, method: str, call: dict) -> SpecConfig:
        """The SpecConfig of ``method``: the call's options (all apply) over load's (each applies
        to the methods that read it), as the server does with its own and a request's."""
        return options.spec_for(method, self._defaults, own=options.pick(SpecConfig, call))

    def _submit(self, job: Job) -> Job:
        with self._lock:
            self._jobs.add(job)
        return self._worker.submit(job)


def _close(worker: Worker, jobs: weakref.WeakSet, lock: threading.Lock) -> None:
    with lock:
        running = list(jobs)
    for job in running:
        job.cancel()
    worker.stop()


def _model_class(rf) -> type[pydantic.BaseModel] | None:
    return rf if isinstance(rf, type) and issubclass(rf, pydantic.BaseModel) else None


def _grammar(rf) -> Grammar | None:
    """The grammar of a call's ``response_format``: OpenAI's dict, or a pydantic model class
    (its JSON schema, strict)."""
    model = _model_class(rf)
    if model is not None:
        return Grammar.json_schema(model.model_json_schema(), True, "response_format")
    return from_response_format(rf)


def _parsed(options: dict, result: Result):
    """``result``, or the pydantic model instance it holds when ``response_format`` is a
    model class."""
    model = _model_class(options.get("response_format"))
    if model is None:
        return result
    if result.finish_reason != "stop":
        raise GrammarError(f"the answer ended ({result.finish_reason}) before the "
                           f"{model.__name__} JSON was complete; raise max_tokens", "max_tokens")
    return model.model_validate_json(result.text)


def _messages(prompt: Messages | Text) -> list[dict]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        return prompt
    raise ConfigError(f"chat takes a list of {{role, content}} messages or a string, got "
                      f"{type(prompt).__name__}; use complete() for raw text or token ids")


def _raw(prompt: Messages | Text) -> Text:
    if isinstance(prompt, str) or (isinstance(prompt, list) and
                                   all(isinstance(t, int) for t in prompt)):
        return prompt
    raise ConfigError(f"complete takes text or token ids, got {type(prompt).__name__}; "
                      "use chat() for messages")


def load(model: str | Target = "demo", *, progress: bool = True, max_concurrency: int = 4,
         learn: bool = False, **options: Any) -> LLM:
    """Load ``model`` (a Hugging Face repo id, a local model directory, a .gguf file or "demo")
    and start its generation thread: an :class:`LLM`.

    ``options`` are every call's defaults; a call may override any of them but ``draft`` and
    ``dtype``, which are fixed when loading. ``method`` defaults to 'draft' with a draft
    model, else 'eagle3' where an EAGLE-3 head is found and pays (``drafters.default.eagle3_pays``),
    else 'corpus' when one is found for the model, else 'lookup'. ``progress`` shows
    download / conversion progress. ``max_concurrency``: how many calls decode together.
    ``learn``: record what decoding computes for ``edgespec learn`` (off unless asked, as an app
    embedding edgespec decides for its users; ``EDGESPEC_LEARN=0`` overrides it).
    """
    return LLM(model, progress=progress, max_concurrency=max_concurrency, learn=learn, **options)


def _document_options() -> None:
    """Append every option, with its help, to ``load``'s docstring (the one definition)."""
    lines = [f"    {f.name}: {options.describe(f, 'python')}" for f in
             options.SURFACES["python"].fields() if f.name != "model"]
    load.__doc__ = f"{load.__doc__.rstrip()}\n\n    Options:\n\n" + "\n".join(lines) + "\n"


_document_options()
