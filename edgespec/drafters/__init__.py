"""Drafting methods. Each implements the Drafter protocol of ``base.py``."""

from __future__ import annotations

from ..config import SamplingConfig, SpecConfig
from ..targets.target import Target
from .auto import AutoDrafter
from .base import AdaptiveLength, Drafter
from .draft_model import DraftModelDrafter, check_vocabularies
from .lookahead import LookaheadDrafter
from .lookup import PromptLookupDrafter


def make_drafter(spec: SpecConfig, target: Target, sampling: SamplingConfig | None = None,
                 draft: Target | None = None) -> Drafter | None:
    """The drafter for ``spec.method`` (None for plain decoding).

    ``draft`` is an already loaded draft model; otherwise ``spec.draft`` is loaded.
    """
    sampling = sampling or SamplingConfig()
    if spec.method == "none":
        return None
    if spec.method in ("draft", "cascade"):
        from .cascade import CascadeDrafter

        kind = DraftModelDrafter if spec.method == "draft" else CascadeDrafter
        return kind(_draft_model(spec, target, draft), sampling, spec.num_draft, spec.max_draft,
                    spec.adaptive, vocab_size=target.args.vocab_size)
    if spec.method == "lookup":
        return PromptLookupDrafter(num_draft=spec.num_draft, max_draft=spec.max_draft)
    if spec.method in ("early-exit", "layer-skip"):
        return _self_draft(spec, target, sampling)
    if spec.method == "quantized":
        from .quantized import QuantizedDrafter

        return QuantizedDrafter(target, spec.draft_bits, sampling, spec.num_draft, spec.max_draft,
                                spec.adaptive)
    if spec.method == "lookahead":
        return LookaheadDrafter(**lookahead_defaults())
    if spec.method == "auto":
        arms = {"none": None, "lookup": PromptLookupDrafter(max_draft=spec.max_draft)}
        if spec.draft or draft is not None:
            sub = SpecConfig(method="draft", draft=spec.draft or "-", num_draft=spec.num_draft,
                             max_draft=spec.max_draft, adaptive=spec.adaptive)
            arms["draft"] = make_drafter(sub, target, sampling, draft=draft)
        return AutoDrafter(arms)
    raise AssertionError(f"SpecConfig accepted unknown method {spec.method!r}")


def lookahead_defaults() -> dict:
    """Lookahead's window, n-gram size and guess-set size for this backend.

    On the CPU every tree node costs a few % of a forward, so the smallest window pays best:
    on 8 MT-bench prompts of the demo model (64 tokens, greedy) W,N,G = 1,2,4 ran at 0.97x
    plain decoding, 1,3,2 at 0.88x, 1,3,6 at 0.78x, 2,3,2 at 0.63x and 4,4,4 at 0.48x. GPUs
    score wide trees almost for free; 4,4,4 is kept there (not measured here)."""
    from ..kernels.backend import on_cpu

    return dict(window=1, ngram=2, guesses=4) if on_cpu() else dict(window=4, ngram=4, guesses=4)


def load_draft(ref: str, target: Target, progress: bool = True) -> Target:
    """Load a draft model in the target's dtype and check that it shares the target's vocabulary."""
    from ..targets import load

    draft = load(ref, dtype=target.dtype if target.dtype != "native" else None, progress=progress)
    check_vocabularies(target, draft)
    return draft


def _draft_model(spec: SpecConfig, target: Target, draft: Target | None) -> Target:
    """The given draft model (checked against the target), or ``spec.draft`` loaded."""
    if draft is None:
        return load_draft(spec.draft, target)
    check_vocabularies(target, draft)
    return draft


def _self_draft(spec: SpecConfig, target: Target, sampling: SamplingConfig) -> Drafter | None:
    """Early-exit / layer-skip self-draft; the layers come from a (memoized) calibration run
    unless given, and a calibration that finds no speedup means plain decoding (with a warning)."""
    import warnings

    from .calibrate import calibrated
    from .early_exit import EarlyExitDrafter
    from .layer_skip import LayerSkipDrafter

    if spec.method == "early-exit" and spec.exit_layer is not None:
        return EarlyExitDrafter(target, sampling, spec.exit_layer, spec.num_draft,
                                spec.max_draft, spec.adaptive)
    cal = calibrated(target, spec.method, spec.num_draft)
    if cal.best is None:
        warnings.warn(f"{spec.method}: {cal.reason}; decoding without speculation", stacklevel=3)
        return None
    if spec.method == "early-exit":
        return EarlyExitDrafter(target, sampling, cal.best, spec.num_draft, spec.max_draft,
                                spec.adaptive)
    return LayerSkipDrafter(target, sampling, cal.best, spec.num_draft, spec.max_draft,
                            adaptive=spec.adaptive)


__all__ = ["AdaptiveLength", "AutoDrafter", "DraftModelDrafter", "Drafter", "LookaheadDrafter", "PromptLookupDrafter", "check_vocabularies", "load_draft", "make_drafter"]
