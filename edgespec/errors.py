"""Typed errors raised at edgespec's public boundary.

Every error message names the offending value and what would have been accepted, so the CLI can
print it as one line and the server can map the *type* to an HTTP status in one place.
"""


class EdgespecError(Exception):
    """Base class for every error edgespec raises on purpose.

    ``param``: the request field the error is about, when one is (the server reports it as the
    OpenAI error's ``param``); None otherwise.
    """

    param: str | None = None


class ConfigError(EdgespecError, ValueError):
    """A setting (sampling, method, draft length, ...) has a value that is not allowed."""


class ModelLoadError(EdgespecError):
    """A model reference could not be resolved or its files could not be read."""


class UnsupportedModelError(ModelLoadError):
    """The model exists but uses an architecture, tensor type or format edgespec does not support."""


class TokenizerError(ModelLoadError):
    """The tokenizer is missing or cannot be built from the model's files."""


class DraftMismatchError(EdgespecError):
    """The draft model cannot draft for this target (e.g. different vocabulary)."""


class ContextOverflowError(EdgespecError, ValueError):
    """The prompt (plus the requested new tokens) does not fit the model's context window."""


class CacheRollbackError(EdgespecError):
    """A cache cannot be rolled back, so speculative decoding cannot use it."""


class UnavailableError(EdgespecError):
    """The generation worker is stopping or has stopped; the request was not run."""


class HeadError(EdgespecError):
    """A trained head cannot be read, or does not fit the target (shape, vocabulary, fingerprint)."""


class GrammarError(ConfigError):
    """A structured-output request (``response_format``, a JSON schema, a grammar) is malformed
    or uses what the grammar engine does not support. ``param`` names the request field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class ToolCallError(ConfigError):
    """A tool-calling request (``tools``, ``tool_choice``, tool messages) is malformed or asks
    for what edgespec cannot do. ``param`` names the request field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class QueueFullError(EdgespecError):
    """The generation queue already holds as many waiting jobs as it may (``max_queue``); the
    job was not queued. ``retry_after``: the seconds a client should wait before retrying (the
    server sends it as 429's ``Retry-After``)."""

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = max(1, int(retry_after))
