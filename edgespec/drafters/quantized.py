"""Quantized self-draft: the target's own weights, quantized with MLX, draft for the target.

:func:`make_quantized_draft` builds a second ``Model`` from the target's weights (dequantized
first when the target is itself quantized) and quantizes every linear and embedding layer to
``bits`` with ``nn.quantize``; the result is a :class:`Target` that :class:`QuantizedDrafter`
(a :class:`DraftModelDrafter` named "quantized") uses as its draft model. Verification is
unchanged, so the method is lossless like any draft model; only acceptance and speed depend on
how close the quantized copy stays to the target.

Honest costs:

- **Speed.** It pays where the quantized copy's forward is much cheaper than the target's:
  Metal with a float16 / 8-bit target. On the Linux CPU backend with MLX's own quantized
  matmul the draft costs about as much as the target, so the method runs slower than plain
  decoding. With the native quantized kernels a 4-bit copy's forward is well under the float32
  target's and it accepts well, yet drafting one token at a time takes most of its time, so it
  gains little over plain decoding, if anything (see docs/measurements.md, "a step's
  anatomy").
- **Memory.** The quantized copy is extra weights held next to the target's: about
  ``bits / 32`` (float32 target) or ``bits / 16`` (half-precision target) of the target's weight
  memory, plus one scale and bias per ``group_size`` weights; norms (and any layer whose input
  width is not a multiple of ``group_size``) share the target's arrays. Its KV cache is as large
  as the target's (same layers and heads).
"""

from __future__ import annotations

import weakref

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..config import SamplingConfig
from ..errors import ConfigError
from ..targets.experts import QuantizedSwitchLinear, SwitchLinear
from ..targets.families import build_model
from ..targets.target import Target
from .draft_model import DraftModelDrafter

QUANT_BITS = (2, 3, 4, 8)
GROUP_SIZES = (32, 64, 128)


_FLOAT = (nn.Linear, nn.Embedding, SwitchLinear)  # the layers nn.quantize turns into the ones below
_QUANTIZED = (nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear)


def make_quantized_draft(target: Target, bits: int, group_size: int = 64) -> Target:
    """A copy of ``target`` with linear and embedding weights quantized to ``bits``.

    Raises ConfigError for bits outside ``QUANT_BITS``, a group size MLX does not support, bits
    not below an already quantized target's, or a model with no layer wide enough to quantize.
    """
    if isinstance(bits, bool) or bits not in QUANT_BITS:
        raise ConfigError(f"draft_bits must be one of {', '.join(map(str, QUANT_BITS))}, got {bits!r}")
    if group_size not in GROUP_SIZES:
        raise ConfigError(f"quantization group_size must be one of "
                          f"{', '.join(map(str, GROUP_SIZES))}, got {group_size!r}")
    have = _target_bits(target.model)
    if have is not None and bits >= have:
        lower = [b for b in QUANT_BITS if b < have]
        raise ConfigError(f"draft_bits {bits} is not below the target's own {have}-bit "
                          f"quantization, so the draft would be no cheaper; choose one of {lower}")
    model = build_model(target.args)
    # Float arrays are shared with the target (no copy); nn.quantize makes the new ones.
    model.load_weights(list(_float_weights(target.model).items()), strict=True)
    quantized: list[str] = []

    def predicate(path: str, module: nn.Module) -> bool:
        ok = isinstance(module, _FLOAT) and module.weight.shape[-1] % group_size == 0
        if ok:
            quantized.append(path)
        return ok

    nn.quantize(model, group_size=group_size, bits=bits, class_predicate=predicate)
    if not quantized:
        raise ConfigError(f"no layer of {target.name} has an input width divisible by "
                          f"group_size {group_size} (hidden size {target.args.hidden_size})")
    mx.eval(model.parameters())
    model.fuse()  # q|k|v and gate|up as one quantized product each, compiled around attention
    return Target(model, target.tokenizer, target.path, target.dtype, quantized=True)


def _target_bits(model: nn.Module) -> int | None:
    """The widest quantization among the model's layers (None when it is not quantized)."""
    bits = [m.bits for _, m in model.named_modules() if isinstance(m, _QUANTIZED)]
    return max(bits) if bits else None


def _float_weights(model: nn.Module) -> dict[str, mx.array]:
    """The model's parameters with quantized layers dequantized (to their scales' dtype)."""
    weights = dict(tree_flatten(model.parameters()))
    for name, m in model.named_modules():
        if not isinstance(m, _QUANTIZED):
            continue
        w = mx.dequantize(m.weight, m.scales, m.get("biases"), group_size=m.group_size,
                          bits=m.bits, mode=m.mode)
        floating = mx.issubdtype(m.scales.dtype, mx.floating)  # mxfp4's are exponents
        weights[f"{name}.weight"] = w.astype(m.scales.dtype if floating else mx.float32)
        weights.pop(f"{name}.scales")
        weights.pop(f"{name}.biases", None)
    return weights


class QuantizedDrafter(DraftModelDrafter):
    """Draft-model speculation with a ``bits``-bit quantized copy of the target as the draft."""

    name = "quantized"

    def __init__(self, target: Target, bits: int, sampling: SamplingConfig, num_draft: int = 4,
                 max_draft: int = 12, adaptive: bool = True, group_size: int = 64):
        self.bits = bits
        super().__init__(quantized_draft_for(target, bits, group_size), sampling, num_draft,
                         max_draft, adaptive, vocab_size=target.args.vocab_size)


_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {(bits, gs): draft}


def quantized_draft_for(target: Target, bits: int, group_size: int = 64) -> Target:
    """``make_quantized_draft``, made once per target and setting and kept while the target
    lives: the server and the chat build a drafter per request, and quantizing the whole
    model each time would cost seconds per request."""
    copies = _COPIES.setdefault(target, {})
    if (bits, group_size) not in copies:
        copies[bits, group_size] = make_quantized_draft(target, bits, group_size)
    return copies[bits, group_size]
