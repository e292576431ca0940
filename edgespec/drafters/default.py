"""The method used when none is named: ``interactive_method`` and ``method_for_model``.

Contract: ``chat``, ``serve``, ``generate`` and the Python API ask ``interactive_method`` before
their model is loaded (only a draft model or a ``--head`` folder can decide then) and again
through ``method_for_model`` once it is. The choice depends on what was given and what is found
for the loaded model, never on the prompt.
"""

from __future__ import annotations

import dataclasses

from ..config import SpecConfig
from ..heads.find import head_kind
from ..methods import NAMES, get
from .registry import heads_for


# interactive_method's rule in words, for --help and the API's documentation ({draft}: how the
# surface names a draft model)
RULE = ("'draft' with {draft}, else the kind of a --head folder given, else 'eagle3' when the "
        "model has an EAGLE-3 head, its weights are not quantized and the native CPU kernels "
        "run, else 'corpus' when it has one, else 'lookup'")


def interactive_method(draft: str | None, target=None, head: str | None = None) -> str:
    """The method of ``chat``, ``serve`` and the Python API when none is named:
    - 'draft' with a draft model;
    - the kind of a ``head`` folder given (``--head``) whose config names it;
    - 'eagle3' when an EAGLE-3 head is found for the loaded ``target`` and ``eagle3_pays``;
    - else 'corpus' when a corpus (``edgespec train corpus``) is found;
    - else 'lookup', the best method that needs nothing.
    The order is the measured one (docs/measurements.md, "The default method": an EAGLE-3 head
    against the corpus, the corpus against lookup). Without ``target`` (before the model is
    loaded) no head is looked for; each surface asks again once its model is loaded, when no
    method was named (``method_for_model``)."""
    if draft is not None:
        return "draft"
    if head is not None:  # a head or corpus folder given: its own method, when its config says
        kind = head_kind(head)
        if kind in NAMES and get(kind).needs_head:
            return kind
    if target is None:
        return "lookup"
    found = heads_for(target, head)
    if "eagle3" in found and eagle3_pays(target):
        return "eagle3"
    return "corpus" if "corpus" in found else "lookup"


def eagle3_pays(target) -> bool:
    """Whether an EAGLE-3 head is the default here: a float target whose products the native
    CPU kernels run. On a quantized target a head's forwards are a larger share of a step and
    it was measured slower than plain decoding (docs/measurements.md, "The default method");
    no GPU run of the default was made."""
    from ..kernels.backend import native_enabled

    return not target.quantized and native_enabled()


def method_for_model(spec: SpecConfig, named: bool, target) -> SpecConfig:
    """``spec`` with the interactive default for the loaded ``target`` unless a method was
    ``named``."""
    if named:
        return spec
    return dataclasses.replace(spec, method=interactive_method(spec.draft, target, spec.head))
