"""What a running server knows: its settings, its worker (model + engine), the names it answers to.

Contract: ``ServerSettings`` is frozen and validated like edgespec's other configs (ConfigError
naming the value). ``ServerState.start(settings)`` loads the target (and the draft model, once)
on the worker thread and returns when it is ready; the app only ever reads the state. A request
may name the served model only by ``names`` -- nothing a request says is ever loaded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..config import METHODS, SpecConfig
from ..drafters import load_draft
from ..errors import ConfigError
from ..targets import load
from .worker import Worker

# Default --method: the first of these that this server can run. Methods that need nothing
# beyond the target would come first; "draft" needs --draft; plain decoding always works.
# By measurement (edgespec bench, demo model, 40 MT-bench prompts): prompt lookup 1.13x plain
# decoding, a truncated draft model 0.75x. "draft" is only available when --draft names a model,
# and then the user asked for it.
METHOD_PREFERENCE = ("draft", "lookup", "none")

MAX_BODY_BYTES = 1 << 20


def spec_config(method: str, draft: str | None, num_draft) -> SpecConfig:
    """The SpecConfig for ``method``; a num_draft above the default max_draft raises max_draft."""
    longest = max(num_draft, SpecConfig.max_draft) if isinstance(num_draft, int) else SpecConfig.max_draft
    return SpecConfig(method=method, draft=draft, num_draft=num_draft, max_draft=longest)


@dataclass(frozen=True)
class ServerSettings:
    """How ``edgespec serve`` was started (the CLI's options; see ``server/cli.py`` for help)."""

    model: str = "demo"
    method: str | None = None  # None: the first of METHOD_PREFERENCE that is available
    draft: str | None = None
    num_draft: int = SpecConfig.num_draft
    dtype: str | None = None
    api_key: str | None = None
    max_tokens_limit: int = 2048
    max_body_bytes: int = MAX_BODY_BYTES
    cors_origins: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    reuse_prefix: bool = True

    def __post_init__(self) -> None:
        spec_config(self.method or "none", self.draft, self.num_draft)
        for name in ("max_tokens_limit", "max_body_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("api_key must not be empty (leave it unset to serve without a key)")

    def available_methods(self) -> tuple[str, ...]:
        """Methods whose requirements this server meets (their SpecConfig builds)."""
        ok = []
        for m in METHODS:
            try:
                SpecConfig(method=m, draft=self.draft)
            except ConfigError:
                continue
            ok.append(m)
        return tuple(ok)

    def default_method(self) -> str:
        if self.method is not None:
            return self.method
        available = self.available_methods()
        return next(m for m in (*METHOD_PREFERENCE, *available) if m in available)


class ServerState:
    """Settings + the started worker; built by ``start`` (model loading happens there)."""

    def __init__(self, settings: ServerSettings, worker: Worker):
        self.settings = settings
        self.worker = worker
        self.target = worker.target
        self.method = settings.default_method()
        self.methods = settings.available_methods()
        self.created = int(time.time())

    @classmethod
    def start(cls, settings: ServerSettings, progress: bool = True) -> "ServerState":
        def load_models():
            target = load(settings.model, dtype=settings.dtype, progress=progress)
            draft = None
            if settings.draft:  # loaded once; every request's drafter shares it
                draft = load_draft(settings.draft, target, progress=progress)
            return target, draft

        return cls(settings, Worker(load_models, settings.reuse_prefix).start())

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
