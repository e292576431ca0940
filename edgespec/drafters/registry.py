"""The one factory: a builder per drafting method of ``methods.py``, and ``make_drafter``.

Contract: ``BUILDERS[name]`` turns the method ``name``'s SpecConfig into its drafter (None for
plain decoding), ``ARMS[name]`` into ``auto``'s arm of it (the methods whose entry says ``arm``).
Importing this module imports no drafter: each builder imports its method's file when called.
``heads_for`` says which methods needing a head or an MTP layer can run on a target. The method
table itself (names, summaries, what each reads and needs) is ``edgespec/methods.py``; its names
are re-exported here for the surfaces that list methods beside building them.

Adding a method is one file under ``drafters/`` plus one entry in ``methods.py`` and its builder
below.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..methods import METHODS, NAMES, Method, available, get, readers

if TYPE_CHECKING:
    from ..config import SamplingConfig, SpecConfig
    from ..targets.target import Target
    from .base import Drafter

Builder = Callable[["SpecConfig", "Target", "SamplingConfig", "Target | None"], "Drafter | None"]
"""``build(spec, target, sampling, draft)``: the drafter, or None for plain decoding. ``draft``
is an already loaded draft model (checked against the target), else ``spec.draft`` is loaded."""


# -- builders: each imports its method's file when called ---------------------------------------

def _plain(spec, target, sampling, draft) -> None:
    return None


def _lookup(spec, target, sampling, draft):
    from .lookup import PromptLookupDrafter

    return PromptLookupDrafter(num_draft=spec.num_draft, max_draft=spec.max_draft)


def _lookup_arm(spec, target, sampling, draft):
    from .lookup import PromptLookupDrafter

    return PromptLookupDrafter(max_draft=spec.max_draft)  # its own longer start length as an arm


def _draft_model(spec, target, sampling, draft):
    from .draft_model import DraftModelDrafter

    return DraftModelDrafter(_loaded_draft(spec, target, draft), sampling, spec.num_draft,
                             spec.max_draft, spec.adaptive, vocab_size=target.args.vocab_size)


def _cascade(spec, target, sampling, draft):
    from .cascade import CascadeDrafter

    return CascadeDrafter(_loaded_draft(spec, target, draft), sampling, spec.num_draft,
                          spec.max_draft, spec.adaptive, vocab_size=target.args.vocab_size)


def _loaded_draft(spec, target, draft):
    """The given draft model (checked against the target), or ``spec.draft`` loaded."""
    from . import load_draft
    from .draft_model import check_vocabularies

    if draft is None:
        return load_draft(spec.draft, target)
    check_vocabularies(target, draft)
    return draft


def _lookahead(spec, target, sampling, draft):
    from .lookahead import LookaheadDrafter

    return LookaheadDrafter(**lookahead_defaults())


def lookahead_defaults() -> dict:
    """Lookahead's window, n-gram size and guess-set size for this backend: on the CPU the
    smallest window (W,N,G = 1,2,4), the fastest of the settings measured on training questions
    of the demo model (docs/measurements.md, "Lookahead's settings on the CPU"); elsewhere
    4,4,4, since a GPU scores a wide tree almost for free (not measured)."""
    from ..kernels.backend import on_cpu

    return dict(window=1, ngram=2, guesses=4) if on_cpu() else dict(window=4, ngram=4, guesses=4)


def _self_draft(spec, target, sampling, draft):
    """Early-exit / layer-skip self-draft; the layers come from a (memoized) calibration run
    unless given, and a calibration that finds no speedup means plain decoding (with a warning)."""
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


def _quantized(spec, target, sampling, draft):
    from .quantized import QuantizedDrafter

    return QuantizedDrafter(target, spec.draft_bits, sampling, spec.num_draft, spec.max_draft,
                            spec.adaptive)


def _eagle3(spec, target, sampling, draft):
    """The EAGLE-3 drafter, with prompt lookup drafting the steps its match is sure of (as
    ``auto``'s arm too: auto's lookup or corpus arm, confident first, takes those steps while
    it is in play; after it is retired the EAGLE-3 arm takes them)."""
    from ..heads.loaded import head_in_bits, load_head_for
    from ..targets.cost import verify_cost_curve
    from .eagle3 import Eagle3Drafter
    from .lookup import PromptLookupDrafter

    _, head = load_head_for(spec.head, target, "eagle3")
    head = head_in_bits(target, head, spec.head_bits)
    return Eagle3Drafter(target, head, verify_cost_curve(target) if spec.adaptive else None,
                         nodes=None if spec.adaptive else spec.num_draft, max_nodes=spec.max_draft,
                         lookup=PromptLookupDrafter())


def _corpus(spec, target, sampling, draft):
    return _corpus_drafter(spec, target, num_draft=spec.num_draft)


def _corpus_arm(spec, target, sampling, draft):
    return _corpus_drafter(spec, target)  # lookup's longer start length, as its arm has


def _corpus_drafter(spec, target, **length):
    from ..heads.loaded import load_head_for
    from ..targets.cost import verify_cost_curve
    from .corpus import CorpusDrafter

    _, table = load_head_for(spec.head, target, "corpus")
    return CorpusDrafter(table, verify_cost_curve(target) if spec.adaptive else None,
                         max_draft=spec.max_draft, **length)


def _medusa(spec, target, sampling, draft):
    from ..heads.loaded import load_head_for
    from ..targets.cost import verify_cost_curve
    from .medusa import MedusaDrafter

    path, heads = load_head_for(spec.head, target, "medusa")
    curve = verify_cost_curve(target)
    return MedusaDrafter(target, heads, curve, shape=None, recipe_dir=path,
                         nodes=None if spec.adaptive else spec.num_draft, max_nodes=spec.max_draft)


_mtp_layers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _mtp(spec, target, sampling, draft):
    """The checkpoint's MTP layer drafting a chain (built once per target, kept as long as it
    is); ConfigError naming what is missing for a target without one."""
    from ..targets.mtp import mtp_target
    from .mtp import MtpDrafter

    if target not in _mtp_layers:
        _mtp_layers[target] = mtp_target(target)
    return MtpDrafter(target, _mtp_layers[target], sampling, spec.num_draft, spec.max_draft,
                      spec.adaptive)


# 8 nodes at least this many times 1 on the measured verify-cost curve: auto's EAGLE-3 arm is
# left out. Between the demo's float32 curves measured on the AMD EPYC VM (1.05-1.38 over noisy
# runs) and its 4-bit ones with the int8 kernels' row groups (1.51-1.58).
STEEP_RATIO = 1.45


def _steep(target) -> bool:
    """Whether ``target``'s verify-cost curve is past ``STEEP_RATIO``. There an EAGLE-3 arm's
    head forwards and tree steps cost auto more than they won (measured on the 4-bit demo over
    the simulated user's questions: docs/measurements.md, "Int8 products in groups of four
    rows"; checked again on the 4-bit and 8-bit files after the blocks ran as one operation:
    "Auto's EAGLE-3 arm on a steep curve, checked again")."""
    from ..targets.cost import verify_cost_curve

    return verify_cost_curve(target).ratio_8() >= STEEP_RATIO


def _auto(spec, target, sampling, draft):
    """A bandit over the arms of ``ARMS`` that can run here (a draft-model arm only with a draft, an
    EAGLE-3 arm or a corpus arm only with a head or corpus for the target, an MTP arm only
    when the checkpoint ships an MTP layer). A corpus arm replaces the lookup arm: it proposes
    lookup's branch itself, plus its table's chain. No EAGLE-3 arm where the verify-cost curve
    is steep (``_steep``), unless a ``--head`` was given. No plain arm when every drafting arm
    gates itself (``Drafter.gates_itself``: the corpus arm alone, as on a steep curve): such an
    arm already proposes only what its curve says pays, and a bandit choosing between it and
    plain decoding on noisy step timings was slower than the corpus drafter alone
    (docs/measurements.md, "Auto without a plain arm")."""
    from .auto import PLAIN, AutoDrafter

    given = draft if draft is not None else spec.draft
    heads = heads_for(target, spec.head)
    names = [m.name for m in METHODS if m.arm and m.available(given, heads)]
    if "corpus" in names:
        names.remove("lookup")
    if "eagle3" in names and spec.head is None and _steep(target):
        names.remove("eagle3")
    arms = {n: ARMS[n](spec, target, sampling, draft) for n in names}
    drafting = [a for a in arms.values() if a is not None]
    if drafting and all(a.gates_itself for a in drafting):
        del arms[PLAIN]
    return AutoDrafter(arms)


def heads_for(target, head: str | None = None) -> frozenset[str]:
    """The methods needing a head that can run on ``target``: the kind of ``head`` when one is
    given (a head directory; HeadError when it does not fit the target), else each kind
    ``find_head`` finds a head of; and ``mtp`` when the checkpoint ships its own MTP layer.
    Heads are judged by their config files alone (``heads.kind``)."""
    from ..heads.loaded import head_kinds
    from ..targets.mtp import has_mtp

    own = frozenset(m.name for m in METHODS if m.needs_mtp and has_mtp(target))
    return own | head_kinds(target, head)


# -- the builders of each method of ``methods.METHODS``, and of auto's arms ---------------------

BUILDERS: dict[str, Builder] = {
    "none": _plain, "lookup": _lookup, "draft": _draft_model, "lookahead": _lookahead,
    "early-exit": _self_draft, "layer-skip": _self_draft, "quantized": _quantized,
    "cascade": _cascade, "eagle3": _eagle3, "medusa": _medusa, "corpus": _corpus, "mtp": _mtp,
    "auto": _auto,
}
ARMS: dict[str, Builder] = {
    "none": _plain, "lookup": _lookup_arm, "draft": _draft_model, "eagle3": _eagle3,
    "corpus": _corpus_arm, "mtp": _mtp,
}
__all__ = ["ARMS", "BUILDERS", "METHODS", "NAMES", "Builder", "Method", "available", "get",
           "heads_for", "make_drafter", "readers"]


def make_drafter(spec: SpecConfig, target: Target, sampling: SamplingConfig | None = None,
                 draft: Target | None = None,
                 prediction: list[int] | None = None) -> Drafter | None:
    """The drafter for ``spec.method`` (None for plain decoding): the one factory.

    ``draft`` is an already loaded draft model; otherwise ``spec.draft`` is loaded.
    ``prediction`` (token ids of a request's predicted output): see
    ``prediction.with_prediction``.
    """
    from ..config import SamplingConfig

    sampling = sampling or SamplingConfig()
    if prediction is not None:
        from .prediction import with_prediction

        return with_prediction(spec, target, sampling, draft, prediction)
    return BUILDERS[spec.method](spec, target, sampling, draft)
