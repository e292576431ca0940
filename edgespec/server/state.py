"""What a running server knows: its settings, its worker (model + engine), the names it answers to.

Contract: ``ServerSettings`` is frozen and validated like edgespec's other configs (ConfigError
naming the value). ``ServerState.start(settings)`` loads the target (and the draft model, once)
on the worker thread and returns when it is ready; the app only ever reads the state. A request
may name the served model only by ``names`` -- nothing a request says is ever loaded.

Admission: the worker decodes up to ``max_concurrency`` requests at once and keeps at most
``max_queue`` waiting (one more gets 429); ``kv_budget_mb`` bounds the KV cache of the requests
decoding together, and a request whose own prompt + max_tokens cannot fit it is refused at once
(``check_kv_budget``: 413) instead of running out of memory later. The worker reports to
``metrics`` (``edgespec/metrics.py``), which ``/metrics`` and ``/health`` read.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from .. import options
from ..config import SpecConfig
from ..drafters import registry
from ..drafters.default import interactive_method
from ..errors import ConfigError
from ..generation_defaults import model_sampling
from ..heads.loaded import load_head_for
from ..kv_budget import KV_BUDGET_MB
from ..learn.flags import learning_from
from ..learn.store import DEFAULT_BUDGET_MB
from ..metrics import Metrics
from ..targets.mtp import check_mtp
from ..worker import GenRequest, Worker, loader
from .errors import RequestTooLargeError

MAX_BODY_BYTES = 1 << 20


@dataclass(frozen=True)
class ServerSettings:
    """How ``edgespec serve`` was started (the CLI's options; see ``server/cli.py`` for help).

    ``spec_options`` are the other SpecConfig options serve was given (``num_draft``,
    ``max_draft``, ...): every request's defaults, which a request may override.
    """

    model: str = "demo"
    method: str | None = None  # None: interactive_method for the loaded model
    draft: str | None = None
    dtype: str | None = None
    spec_options: Mapping[str, object] = field(default_factory=dict)
    api_key: str | None = None
    max_tokens_limit: int = 2048
    max_body_bytes: int = MAX_BODY_BYTES
    cors_origins: tuple[str, ...] = ()
    host: str = "127.0.0.1"  # the bind address: a name requests may use in their Host header
    allowed_hosts: tuple[str, ...] = ()  # other such names ('*': any)
    aliases: tuple[str, ...] = ()
    reuse_prefix: bool = True
    max_concurrency: int = 4  # requests decoding at once (continuous batching)
    max_queue: int = 64  # requests waiting beyond those; one more gets 429
    kv_budget_mb: int = KV_BUDGET_MB  # KV cache of the requests decoding together, in MiB
    learn: bool | None = None  # record for learning (None: on unless EDGESPEC_LEARN=0)
    learn_budget_mb: int = DEFAULT_BUDGET_MB  # the recordings' disk budget
    learn_when_idle: bool = False  # fine-tune after a while without a request

    def __post_init__(self) -> None:
        bad = set(self.spec_options) - ({f.name for f in fields(SpecConfig)} - {"method", "draft"})
        if bad:
            raise ConfigError(f"spec_options takes SpecConfig options but method and draft; "
                              f"got {', '.join(sorted(bad))}")
        self.spec(self.default_method(), {})  # ConfigError for a bad value, before any loading
        for name, least in (("max_tokens_limit", 1), ("max_body_bytes", 1),
                            ("max_concurrency", 1), ("max_queue", 0), ("kv_budget_mb", 1),
                            ("learn_budget_mb", 1)):
            v = vars(self)[name]
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                raise ConfigError(f"{name} must be an integer >= {least}, got {v!r}")
        for name, values in (("allowed_hosts", self.allowed_hosts), ("cors_origins", self.cors_origins)):
            if any(not isinstance(v, str) or not v.strip() or v != v.strip() for v in values):
                raise ConfigError(f"{name} must be non-empty names without spaces, got {values!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("api_key must not be empty (leave it unset to serve without a key)")

    @property
    def kv_budget_bytes(self) -> int:
        return self.kv_budget_mb << 20

    def spec(self, method: str, sent: Mapping) -> SpecConfig:
        """The SpecConfig of a request for ``method``: what it sent (all of it applies) over the
        server's options (each applies to the methods that read it)."""
        return options.spec_for(method, {**self.spec_options, "draft": self.draft},
                                own=options.pick(SpecConfig, sent, skip=("draft",)))

    def available_methods(self, target) -> tuple[str, ...]:
        """Methods whose requirements this server meets (a draft model for 'draft', a trained
        head for the loaded ``target`` for 'eagle3' and 'medusa', ...)."""
        return registry.available(self.draft, registry.heads_for(target, self.spec_options.get("head")))

    def default_method(self, target=None) -> str:
        """The method of requests that name none: ``method``, else the interactive default
        (for ``target`` once loaded: 'corpus' when the model has one)."""
        if self.method is not None:
            return self.method
        return interactive_method(self.draft, target, self.spec_options.get("head"))


class ServerState:
    """Settings + the started worker; built by ``start`` (model loading happens there)."""

    def __init__(self, settings: ServerSettings, worker: Worker, metrics: Metrics | None = None):
        self.settings = settings
        self.worker = worker
        self.metrics = metrics
        self.target = worker.target
        self.method = settings.default_method(self.target)
        self.methods = settings.available_methods(self.target)
        self.sampling = model_sampling(self.target.path)  # a request's defaults, under its fields
        if self.method not in self.methods and registry.get(self.method).needs_head:
            load_head_for(settings.spec(self.method, {}).head, self.target, self.method)
        if self.method not in self.methods and registry.get(self.method).needs_mtp:
            check_mtp(self.target)  # ConfigError naming what the checkpoint lacks
        self.created = int(time.time())
        self._check_default_fits()

    @classmethod
    def start(cls, settings: ServerSettings, progress: bool = True) -> "ServerState":
        load = loader(settings.model, settings.draft, settings.dtype, progress)
        metrics = Metrics()
        worker = Worker(load, settings.reuse_prefix, max_concurrency=settings.max_concurrency,
                        max_queue=settings.max_queue, kv_budget_bytes=settings.kv_budget_bytes,
                        metrics=metrics,
                        learning=learning_from("serve", settings.learn, settings.learn_budget_mb,
                                               settings.learn_when_idle))
        worker.start()
        try:
            return cls(settings, worker, metrics)
        except BaseException:
            worker.stop()
            raise

    def _check_default_fits(self) -> None:
        """ConfigError when a request that sets no max_tokens (it gets --max-tokens-limit) could
        never fit the KV budget: a server that would refuse every such request does not start."""
        s, per_token = self.settings, self.worker.kv_per_token("draft")
        need = s.max_tokens_limit * per_token
        if need > s.kv_budget_bytes:
            raise ConfigError(
                f"--max-tokens-limit {s.max_tokens_limit} (the max_tokens of a request that sets "
                f"none) needs {need / 2**20:.1f} MiB of KV cache ({per_token} bytes per token), "
                f"over --kv-budget-mb {s.kv_budget_mb}: raise --kv-budget-mb to at least "
                f"{-(-need // 2**20)} or lower --max-tokens-limit")

    def check_kv_budget(self, gen: GenRequest) -> None:
        """RequestTooLargeError (413) when ``gen``'s prompt + max_tokens alone need more KV
        cache than the whole budget (with the draft model's cache for a 'draft' request)."""
        per_token, need = self.worker.kv_per_token(gen.spec.method), self.worker.kv_need(gen)
        budget = self.settings.kv_budget_bytes
        if need > budget:
            raise RequestTooLargeError(
                f"the prompt ({len(gen.prompt)} tokens) + max_tokens ({gen.generation.max_tokens}) "
                f"need {need / 2**20:.1f} MiB of KV cache ({per_token} bytes per token); this "
                f"server's KV budget is {self.settings.kv_budget_mb} MiB (--kv-budget-mb): send a "
                "shorter prompt or a smaller max_tokens", "max_tokens")

    @property
    def model_name(self) -> str:
        return self.target.name

    @property
    def listed_names(self) -> tuple[str, ...]:
        """What /v1/models lists: the served model's name and its aliases."""
        return tuple(dict.fromkeys((self.model_name, *self.settings.aliases)))

    @property
    def names(self) -> tuple[str, ...]:
        """Model names a request may use: the listed ones and the reference the server was given."""
        return (*self.listed_names, self.settings.model)

    def stop(self) -> None:
        self.worker.stop()
