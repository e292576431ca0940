"""What one generation cost and gained, and the one way each number is written.

Contract: the engine fills a :class:`Stats` per call. ``tau``, ``acceptance_rate`` and
``tokens_per_s`` are the only definitions of those ratios. Every surface writes them through this
module: :meth:`Stats.summary` / :meth:`Stats.parts` are the human form (the CLI, the chat app's
status bar, answer footers and line mode), :meth:`Stats.as_dict` the machine form (``--json``, the
server's ``usage``), :func:`format_metric` a value with its unit for tables (``bench``) and
:func:`phrase` one metric in words.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

_FORMATS = {  # metric -> (format spec, unit written after the value, how it reads in a phrase)
    "generated_tokens": ("d", "", "{} tokens"),
    "tokens_per_s": (".1f", "", "{} tok/s"),
    "tau": (".2f", "", "τ {}"),
    "acceptance_rate": (".0%", "", "accepted {}"),
    "cached_tokens": ("d", "", "{} cached"),
    "speedup": (".2f", "×", "{} vs plain"),
    "peak_memory_mb": (".0f", "", "peak {} MB"),
}


def format_metric(name: str, value: float | int | None) -> str:
    """``value`` of the metric ``name`` (a key of ``_FORMATS``) with its unit; None is "—"."""
    spec, unit, _ = _FORMATS[name]
    return "—" if value is None else format(value, spec) + unit


def phrase(name: str, value: float | int | None) -> str:
    """The metric as a person reads it in a line: ``τ 2.40``, ``12.3 tok/s``, ``1.18× vs plain``."""
    return _FORMATS[name][2].format(format_metric(name, value))


@dataclass
class Stats:
    method: str = "none"
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV was reused from the prefix store
    generated_tokens: int = 0
    target_forwards: int = 0
    proposed: int = 0  # the drafter's tokens (a rule's cut ones too)
    accepted: int = 0  # of those, the ones the target kept
    forced: int = 0  # tokens a rule (a grammar) forced, drafted for free: not in the two above
    # predicted outputs (OpenAI's usage.completion_tokens_details): the drafted tokens taken
    # from the request's prediction that the target kept, and those it rejected
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
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
        """The drafter's tokens kept per token it proposed (forced tokens are not drafts)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def as_dict(self) -> dict:
        """Every field and ratio, floats rounded to 4 digits: the machine-readable form."""
        d = asdict(self)
        d.update(tau=self.tau, acceptance_rate=self.acceptance_rate, tokens_per_s=self.tokens_per_s)
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in d.items()}

    def parts(self, speedup: float | None = None) -> list[str]:
        """The numbers a person reads, as phrases: tokens, tok/s, then (when drafting) τ and
        acceptance, the reused prompt tokens, a predicted output's kept and rejected tokens,
        and ``speedup`` against plain decoding when known."""
        out = [phrase("generated_tokens", self.generated_tokens),
               phrase("tokens_per_s", self.tokens_per_s)]
        if self.method != "none":
            out += [phrase("tau", self.tau), phrase("acceptance_rate", self.acceptance_rate)]
        if self.cached_tokens:
            out.append(phrase("cached_tokens", self.cached_tokens))
        if self.accepted_prediction_tokens or self.rejected_prediction_tokens:
            out.append(f"prediction {self.accepted_prediction_tokens} kept / "
                       f"{self.rejected_prediction_tokens} rejected")
        if speedup is not None:
            out.append(phrase("speedup", speedup))
        return out

    def summary(self, speedup: float | None = None, *extra: str) -> str:
        """One line: ``[method] 12 tokens, 30.1 tok/s, τ 2.40, accepted 71.4%`` (+ ``extra``)."""
        return f"[{self.method}] " + ", ".join([*self.parts(speedup), *extra])
