"""What a trained head is: its shape, the target it was trained for, and the check that it fits.

``HeadConfig`` is the one description of a head (EAGLE-3 or Medusa) that every file format maps
onto (``formats.py``), the trainer fills (``HeadConfig.for_target``) and the drafters read.
``fingerprint(target)`` names a target by its config and a few weight values, so that a head
trained for one model is never used to draft for another with the same shapes; ``check`` raises
:class:`HeadError` naming both values when a head does not fit a target.

The fingerprint survives the dtype a target is loaded in (float32, float16, quantized): it reads
the config fields that fix the model's shape and, for a few embedding rows, the index of the
largest and smallest entry, which rounding and group quantization keep (a group's extremes are
stored exactly by affine quantization).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace

import mlx.core as mx
import numpy as np

from ..errors import HeadError

KINDS = ("eagle3", "medusa")

_IDENTITY = ("model_type", "hidden_size", "num_hidden_layers", "intermediate_size",
             "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")
_PROBE_ROWS = 8


def fingerprint(target) -> str:
    """A short hash of ``target``'s shape-fixing config fields and a few embedding values."""
    a = target.args
    ident = {k: getattr(a, k, None) for k in _IDENTITY}
    V = a.vocab_size
    rows = [int(i) for i in np.linspace(V // 3, V - 1, _PROBE_ROWS)]  # past the special tokens
    emb = np.array(target.model.embed(mx.array(rows)[None])[0].astype(mx.float32))
    probe = [[int(r.argmax()), int(r.argmin())] for r in emb]
    text = json.dumps({"config": ident, "probe": probe}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def vocab_index(target_ids, size: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A draft vocabulary's ids (int64, as given) and its index over the target vocabulary
    (int32 (vocab_size,): the draft row of each target id, -1 outside); ValueError unless the
    ids are ``size`` distinct target ids (EAGLE-3's LM head rows, Medusa's shared-head rows)."""
    ids = np.asarray(target_ids, dtype=np.int64)
    if ids.shape != (size,) or size == 0 or len(np.unique(ids)) != size or (
            ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"needs {size} distinct target ids in [0, {vocab_size})")
    index = np.full(vocab_size, -1, dtype=np.int32)
    index[ids] = np.arange(size)
    return ids, index


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's feature layers: the hidden states entering layers 2, L//2 and L-3 (clamped
    into 0..L for very shallow models, where they may repeat)."""
    return tuple(min(max(i, 0), num_layers) for i in (2, num_layers // 2, num_layers - 3))


@dataclass(frozen=True)
class HeadConfig:
    """A trained head's shape and the target it belongs to (JSON: ``to_dict`` / ``from_dict``)."""

    kind: str  # "eagle3" | "medusa"
    hidden_size: int  # the target's H
    vocab_size: int  # the target's V
    # eagle3: rows of its LM head (== vocab_size when not reduced); medusa sharing the target's
    # LM head: how many of its rows the heads draft from (0: all)
    draft_vocab_size: int = 0
    aux_layers: tuple[int, ...] = ()  # eagle3: layers whose INPUT hidden states are the features
    num_heads: int = 1  # medusa: K heads
    num_layers: int = 1  # medusa: residual blocks per head
    own_lm_head: bool = True  # medusa: its own Linear(H, V) per head, else the target's, frozen
    # eagle3's decoder layer (the target's geometry unless a checkpoint says otherwise)
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, hash=False)
    # the target it was trained for
    target_layers: int | None = None
    target_fingerprint: str | None = None
    target_name: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise HeadError(f"head kind {self.kind!r} is not known; known: {', '.join(KINDS)}")
        object.__setattr__(self, "aux_layers", tuple(int(i) for i in self.aux_layers))
        if self.kind == "eagle3" and self.draft_vocab_size <= 0:
            object.__setattr__(self, "draft_vocab_size", self.vocab_size)
        if self.kind == "medusa" and self.own_lm_head and self.draft_vocab_size:
            raise HeadError("Medusa heads with their own LM heads have no draft vocabulary "
                            f"(draft_vocab_size {self.draft_vocab_size})")
        if self.draft_vocab_size > self.vocab_size:
            raise HeadError(f"draft_vocab_size {self.draft_vocab_size} exceeds the vocabulary "
                            f"size {self.vocab_size}")

    @classmethod
    def for_target(cls, target, kind: str, *, draft_vocab_size: int | None = None,
                   aux_layers: tuple[int, ...] | None = None, num_heads: int = 4,
                   num_layers: int = 1, own_lm_head: bool = True) -> HeadConfig:
        """A new head's config for ``target``: its geometry, default aux layers, its fingerprint."""
        a = target.args
        common = dict(kind=kind, hidden_size=a.hidden_size, vocab_size=a.vocab_size,
                      target_layers=a.num_hidden_layers, target_fingerprint=fingerprint(target),
                      target_name=target.name)
        if kind == "medusa":
            return cls(**common, num_heads=num_heads, num_layers=num_layers,
                       own_lm_head=own_lm_head, draft_vocab_size=draft_vocab_size or 0)
        return cls(
            **common, draft_vocab_size=draft_vocab_size or a.vocab_size,
            aux_layers=default_aux_layers(a.num_hidden_layers) if aux_layers is None else aux_layers,
            num_attention_heads=a.num_attention_heads, num_key_value_heads=a.num_key_value_heads,
            head_dim=a.head_dim, intermediate_size=a.intermediate_size,
            rms_norm_eps=a.rms_norm_eps, rope_theta=a.rope_theta, rope_scaling=a.rope_scaling)

    def check(self, target) -> None:
        """Raise HeadError (naming the head's value and the target's) unless this head fits."""
        a = target.args
        what = f"this {self.kind} head"
        pairs = [("hidden size", self.hidden_size, a.hidden_size),
                 ("vocabulary size", self.vocab_size, a.vocab_size)]
        if self.target_layers is not None:
            pairs.append(("layer count", self.target_layers, a.num_hidden_layers))
        for name, mine, theirs in pairs:
            if mine != theirs:
                raise HeadError(f"{what} was trained for a target with {name} {mine}, but "
                                f"{target.name} has {name} {theirs}")
        bad = [i for i in self.aux_layers if not 0 <= i <= a.num_hidden_layers]
        if bad:
            raise HeadError(f"{what} reads features entering layers {bad}, but {target.name} has "
                            f"layers 0..{a.num_hidden_layers}")
        if self.target_fingerprint is not None:
            theirs = fingerprint(target)
            if theirs != self.target_fingerprint:
                raise HeadError(
                    f"{what} was trained for target fingerprint {self.target_fingerprint}"
                    f"{f' ({self.target_name})' if self.target_name else ''}, but {target.name} "
                    f"has fingerprint {theirs}: the weights differ, so its drafts would not match")

    @property
    def num_features(self) -> int:
        """eagle3: hidden states fused by fc (3 when a checkpoint names no aux layers yet)."""
        return len(self.aux_layers) or 3

    def for_layers(self, num_layers: int) -> HeadConfig:
        """This config with the default aux layers filled in when a checkpoint named none."""
        if self.kind != "eagle3" or self.aux_layers:
            return self
        return replace(self, aux_layers=default_aux_layers(num_layers))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["aux_layers"] = list(self.aux_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> HeadConfig:
        """From ``to_dict``'s output; unknown keys are dropped, a missing required one is named."""
        known = {f.name for f in fields(cls)}
        missing = [k for k in ("kind", "hidden_size", "vocab_size") if k not in d]
        if missing:
            raise HeadError(f"head config lacks {', '.join(missing)} (has {sorted(d)})")
        return cls(**{k: v for k, v in d.items() if k in known})
