"""The drafting methods edgespec knows: one :class:`Method` entry each, and the one factory.

Contract: every surface reads the method list from here -- config validation, the CLI's
``--method`` choices, the server's request schema and its available methods, the chat palette,
``bench`` and ``auto``'s arms. An entry says what its method needs (a separate draft model, a
trained head) and which ``SpecConfig`` fields its builder reads. Importing this module imports
no drafter: each builder imports its method's file when called, so ``config.py`` can validate a
method name here without an import cycle.

Adding a method is one file under ``drafters/`` plus one entry (and its builder) below.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..config import SamplingConfig, SpecConfig
    from ..targets.target import Target
    from .base import Drafter

Builder = Callable[["SpecConfig", "Target", "SamplingConfig", "Target | None"], "Drafter | None"]
"""``build(spec, target, sampling, draft)``: the drafter, or None for plain decoding. ``draft``
is an already loaded draft model (checked against the target), else ``spec.draft`` is loaded."""

_LENGTH = ("num_draft", "max_draft", "adaptive")


@dataclass(frozen=True)
class Method:
    """One drafting method: its name, a one-line summary, its builder and what it needs."""

    name: str
    summary: str
    build: Builder
    reads: tuple[str, ...] = ()  # the SpecConfig fields ``build`` (and ``arm``) read
    needs_draft: bool = False  # a separate draft model (--draft REF)
    needs_head: bool = False  # a trained head (EAGLE-3 / Medusa) or corpus of its own name's kind
    arm: Builder | None = None  # how ``auto`` builds it as an arm; None: not one of its arms
    needs_mtp: bool = False  # the checkpoint's own multi-token-prediction layer

    def available(self, draft: object = None, heads: Collection[str] = ()) -> bool:
        """Whether it can run when ``draft`` (a reference or a loaded model; None: no draft
        model) is what was given and ``heads`` names the methods a trained head exists for
        (``heads_for``), and ``mtp`` when the checkpoint ships an MTP layer."""
        return ((not (self.needs_head or self.needs_mtp) or self.name in heads)
                and (draft is not None or not self.needs_draft))

    def uses_draft(self, draft: object = None) -> bool:
        """Whether building it with ``draft`` given uses that draft model."""
        return self.needs_draft or (draft is not None and "draft" in self.reads)


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
    """Lookahead's window, n-gram size and guess-set size for this backend.

    On the CPU the smallest window pays best. First chosen on 8 MT-bench prompts (an early
    stop; evaluation prompts must not choose anything), re-measured in stop 22 on 8 training
    questions of the demo model (64 tokens, greedy, the first plain run timed before each):
    W,N,G = 1,2,4 ran at 0.89x plain decoding, 1,3,2 at 0.83x, 1,3,6 at 0.82x, 2,3,2 at 0.78x
    and 4,4,4 at 0.59x: the same order. GPUs score wide trees almost for free; 4,4,4 is kept
    there (not measured here)."""
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
    from ..targets.cost import verify_cost_curve
    from .eagle3 import Eagle3Drafter
    from .lookup import PromptLookupDrafter

    _, head = load_head_for(spec, target, "eagle3")
    head = _head_in_bits(target, head, spec.head_bits)
    return Eagle3Drafter(target, head, verify_cost_curve(target) if spec.adaptive else None,
                         nodes=None if spec.adaptive else spec.num_draft, max_nodes=spec.max_draft,
                         lookup=PromptLookupDrafter())


_quantized_heads: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _head_in_bits(target, head, bits: int | None):
    """``head``, or its copy with weights group-quantized to ``bits`` (made once per target,
    head and bits, kept as long as the target is). ``bits`` None: 8 where the native kernels
    run the products (a draft step streams a quarter of the bytes), else float32 (MLX's own
    CPU quantized product would cost more than it saves)."""
    from ..heads.eagle3 import quantized_head
    from ..kernels.backend import native_enabled

    if bits is None:
        bits = 8 if native_enabled() else 0
    if not bits:
        return head
    made = _quantized_heads.setdefault(target, {})
    key = (id(head), bits)  # the float head is held in the value: its id is not reused
    if key not in made:
        made[key] = (head, quantized_head(head, bits))
    return made[key][1]


def _corpus(spec, target, sampling, draft):
    return _corpus_drafter(spec, target, num_draft=spec.num_draft)


def _corpus_arm(spec, target, sampling, draft):
    return _corpus_drafter(spec, target)  # lookup's longer start length, as its arm has


def _corpus_drafter(spec, target, **length):
    from ..targets.cost import verify_cost_curve
    from .corpus import CorpusDrafter

    _, table = load_head_for(spec, target, "corpus")
    return CorpusDrafter(table, verify_cost_curve(target) if spec.adaptive else None,
                         max_draft=spec.max_draft, **length)


def _medusa(spec, target, sampling, draft):
    from ..targets.cost import verify_cost_curve
    from .medusa import MedusaDrafter

    path, heads = load_head_for(spec, target, "medusa")
    curve = verify_cost_curve(target)
    return MedusaDrafter(target, heads, curve, shape=None, recipe_dir=path,
                         nodes=None if spec.adaptive else spec.num_draft, max_nodes=spec.max_draft)


# Per target (weakly: a target's heads go with it), per head folder (path, config mtime):
# the loaded (kind, module), and the kinds alone for ``heads_for``, which only needs a head's
# kind and fit (its module is not shared with a drafter that may run on another thread).
_loaded_heads: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_head_kinds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_HEAD_KINDS = "eagle3, medusa or corpus"


def _head_key(path) -> tuple:
    return str(path.resolve()), (path / "config.json").stat().st_mtime_ns


def _head_dir(path, kind: str):
    from pathlib import Path

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"head {str(path)!r} is not a head directory (it has no config.json); "
                          f"`edgespec train {kind}` writes one")
    return path


def _load(path, target) -> tuple[str, object]:
    """(kind, module) of the head folder ``path``, checked against ``target``: a network head
    (EAGLE-3, Medusa) or a corpus (its n-gram table)."""
    from ..heads.corpus import load_corpus
    from ..heads.find import head_kind
    from ..heads.formats import load_head

    if head_kind(path) == "corpus":
        return "corpus", load_corpus(path, target)
    config, module = load_head(path, target)
    return config.kind, module


def _kind(path, target) -> str:
    """The kind of the head folder ``path``, checked against ``target`` (a corpus by its config
    alone: its table is counted only when a drafter needs it)."""
    from ..heads.corpus import check_corpus, corpus_section
    from ..heads.find import head_kind
    from ..heads.formats import load_head

    if head_kind(path) == "corpus":
        check_corpus(corpus_section(path), target)
        return "corpus"
    return load_head(path, target)[0].kind


def load_head_for(spec, target, kind: str):
    """(path, module) of ``spec.head``, else of the head ``find_head`` finds for ``target``;
    ConfigError naming the model and ``edgespec train`` when there is none. Loaded once per
    (path, modification time) and target."""
    from ..heads.find import a_head, find_head

    path = spec.head if spec.head is not None else find_head(target, kind)
    if path is None:
        raise ConfigError(
            f"method {kind!r} needs a trained {kind} head and none was found for model "
            f"{target.name}: pass --head PATH, or train one with `edgespec train {kind} --model "
            f"{target.path or target.name} --out DIR`")
    path = _head_dir(path, kind)
    loaded = _loaded_heads.setdefault(target, {})
    key = _head_key(path)
    if key not in loaded:
        loaded[key] = _load(path, target)
        _head_kinds.setdefault(target, {})[key] = loaded[key][0]
    have, module = loaded[key]
    if have != kind:
        raise ConfigError(f"head {str(path)!r} is {a_head(have)}; method {kind!r} needs "
                          f"{a_head(kind)}")
    return path, module


def heads_for(target, head: str | None = None) -> frozenset[str]:
    """The methods needing a head that can run on ``target``: the kind of ``head`` when one is
    given (a head directory; HeadError when it does not fit the target), else each kind
    ``find_head`` finds a head of; and ``mtp`` when the checkpoint ships its own MTP layer."""
    from ..heads import find_head
    from ..targets.mtp import has_mtp

    kinds = [m.name for m in METHODS if m.needs_head]
    own = frozenset(m.name for m in METHODS if m.needs_mtp and has_mtp(target))
    if head is not None:
        path = _head_dir(head, _HEAD_KINDS)
        known = _head_kinds.setdefault(target, {})
        key = _head_key(path)
        if key not in known:
            known[key] = _kind(path, target)
        return own | frozenset(k for k in kinds if k == known[key])
    return own | frozenset(k for k in kinds if find_head(target, k) is not None)


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


def _auto(spec, target, sampling, draft):
    """A bandit over the arms below that can run here (a draft-model arm only with a draft, an
    EAGLE-3 arm or a corpus arm only with a head or corpus for the target, an MTP arm only
    when the checkpoint ships an MTP layer). A corpus arm replaces the lookup arm: it proposes
    lookup's branch itself, plus its table's chain."""
    from .auto import AutoDrafter

    given = draft if draft is not None else spec.draft
    heads = heads_for(target, spec.head)
    names = [m.name for m in METHODS if m.arm is not None and m.available(given, heads)]
    if "corpus" in names:
        names.remove("lookup")
    return AutoDrafter({n: get(n).arm(spec, target, sampling, draft) for n in names})


# -- the registry: its order is the order every surface lists methods in (and auto's arms) ------

METHODS: tuple[Method, ...] = (
    Method("none", "plain decoding: the target alone, one token per forward", _plain,
           arm=_plain),
    Method("lookup", "prompt lookup: copies what followed the same words earlier in the text",
           _lookup, reads=("num_draft", "max_draft"), arm=_lookup_arm),
    Method("draft", "a smaller draft model proposes tokens, the target verifies them at once",
           _draft_model, reads=("draft", *_LENGTH), needs_draft=True, arm=_draft_model),
    Method("lookahead", "lookahead decoding: Jacobi iterations and an n-gram pool, one pass a step",
           _lookahead),
    Method("early-exit", "the target's first layers draft for the whole target (calibrated)",
           _self_draft, reads=("exit_layer", *_LENGTH)),
    Method("layer-skip", "the target with a calibrated subset of its layers drafts for itself",
           _self_draft, reads=_LENGTH),
    Method("quantized", "the target's weights quantized to a few bits draft for the target",
           _quantized, reads=("draft_bits", *_LENGTH)),
    Method("cascade", "prompt lookup drafts for the draft model, which drafts for the target",
           _cascade, reads=("draft", *_LENGTH), needs_draft=True),
    Method("eagle3", "EAGLE-3: a trained head drafts a dynamic tree from the target's features "
           "(prompt lookup drafts the steps it is sure of)",
           _eagle3, reads=("head", "head_bits", *_LENGTH), needs_head=True, arm=_eagle3),
    Method("medusa", "Medusa: trained heads guess the next tokens from the last hidden state",
           _medusa, reads=("head", *_LENGTH), needs_head=True),
    Method("corpus", "prompt lookup plus the model's own n-grams, counted over its answers by "
           "`edgespec train corpus`", _corpus, reads=("head", *_LENGTH), needs_head=True,
           arm=_corpus_arm),
    Method("mtp", "the checkpoint's own multi-token-prediction layer drafts a chain (Qwen3.5/3.6, "
           "Qwen3-Next checkpoints that keep their mtp.* weights)", _mtp, reads=_LENGTH,
           arm=_mtp, needs_mtp=True),
    Method("auto", "a bandit over plain decoding, lookup (or the corpus, when the model has one), "
           "the draft model, an EAGLE-3 head and the checkpoint's MTP layer, by measured speed",
           _auto,
           reads=("draft", "head", "head_bits", *_LENGTH)),
)

NAMES: tuple[str, ...] = tuple(m.name for m in METHODS)


def get(name: str) -> Method:
    """The entry for ``name``; ConfigError naming it and the known methods otherwise."""
    for m in METHODS:
        if m.name == name:
            return m
    raise ConfigError(f"unknown method {name!r}; choose one of: {', '.join(NAMES)}")


def available(draft: object = None, heads: Collection[str] = ()) -> tuple[str, ...]:
    """The methods that can run when ``draft`` is what was given (None: no draft model) and
    ``heads`` names the methods with a trained head (``heads_for``)."""
    return tuple(m.name for m in METHODS if m.available(draft, heads))


def readers(field_name: str) -> tuple[str, ...]:
    """The methods whose builder reads the SpecConfig field ``field_name``."""
    return tuple(m.name for m in METHODS if field_name in m.reads)


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
    return get(spec.method).build(spec, target, sampling, draft)
