"""Loading a model directory (HF / mlx-lm layout; see ``loading/hub.py`` for model references)
into a :class:`Target`, with the dtype policy: float32 on the CPU backend (with an optimized BLAS
float32 matmuls are memory-bound, which is what speculation needs), the checkpoint's own
quantization / half precision on Metal and CUDA; ``dtype=`` overrides. Quantized checkpoints
(mlx-lm's ``quantization`` config) are kept quantized or dequantized to the asked dtype; kept
quantized on the CPU backend, everything but the packed weights is float32 (scales, biases,
norms, so the activations too), the layout the native quantized kernel takes, and where it
runs, weights of a width it lacks (5 bits: GGUF's Q5_0, Q5_1 and Q5_K; 1-3 and 6 bits) are
re-packed at the next width it takes, the same weights at more bytes
(``qmatmul.widen_for_native``), and where a fused block's q/k/v or gate/up products differ in
width the narrower are re-packed at the wider, so that the block joins them and runs natively
(``qmatmul.match_widths``; a GGUF Q4_K_M's v is Q6_K in half its layers).

A GGUF's Q6_K matrices (one scale per 16 weights, a group size MLX does not have) arrive as the
converter's exact float32 decoding, listed in config.json's ``gguf_decoded_dense``. A load that
keeps the model quantized (``auto``) rounds them to MLX's 8-bit affine groups of 32 (the largest
error a weight gets is half that group's 8-bit step: 64/510 of the coarser Q6_K step of the
group's two runs of 16, or less) rather than stream 4 bytes a weight, 4.9 times the file's; the
model is then that rounding of the file, decoded the same way by plain and speculative decoding.
``EDGESPEC_Q6K=float`` keeps them float32, the file's values exactly; ``--dtype float32`` decodes
every layer exactly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import ModelLoadError, UnsupportedModelError
from ..kernels.backend import native_enabled
from ..kernels.fused_block import quantized_products, refuses
from ..kernels.qmatmul import match_widths, widen_for_native
from ..loading.gguf.tensors import DENSE_DECODED_KEY
from ..loading.tokenizer import Tokenizer
from .config_check import check_shapes, check_values
from .decoder import Decoder
from .families import family_of
from .mtp import split_mtp
from .parts import FusedForms
from .target import Target

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def default_dtype() -> str:
    """float32 on the CPU backend; keep the checkpoint's precision on GPUs ('auto')."""
    return "float32" if mx.default_device() == mx.cpu or not mx.is_available(mx.gpu) else "auto"


def load_target(path: Path, dtype: str | None = None) -> Target:
    """Load a model directory; ``dtype`` in (None|'auto', 'float32', 'float16', 'bfloat16')."""
    path = Path(path)
    config = _read_config(path)
    family = family_of(config)
    check_values(config, family.args, path)
    try:
        args = family.args.from_dict(config)
    except TypeError as e:  # a required field missing (the dataclass names it)
        raise ModelLoadError(f"{path / 'config.json'} is not a complete "
                             f"{config.get('model_type')!r} config: {e}") from None
    check_shapes(args, path)
    weights = _read_weights(path)
    quant = _mlx_quantization(config.get("quantization") or config.get("quantization_config"))
    dtype = dtype or default_dtype()
    if dtype not in ("auto", *DTYPES):
        raise ModelLoadError(f"dtype {dtype!r} is not supported; choose auto, {', '.join(DTYPES)}")
    rounded: dict[str, list[str]] = {}
    round_q6k = _q6k_rounds()  # checked whatever the dtype: a bad value is named
    if dtype == "auto" and round_q6k:
        quant, rounded = _round_decoded(weights, config.get(DENSE_DECODED_KEY) or {}, quant)
    model = family.model(args)
    weights = model.sanitize(weights)
    keep_quantized = quant is not None and dtype == "auto"
    cast = DTYPES.get(dtype)  # the float arrays' dtype; None ('auto'): the checkpoint's
    if keep_quantized:
        _quantize_like(model, weights, quant)
        if mx.default_device() == mx.cpu:  # the packed weights stay; scales, biases, norms and
            cast = mx.float32  # activations in float32 (kernels/qmatmul)
    elif quant is not None:
        weights = _dequantize(weights, quant, cast)
    if cast is not None:
        weights = {k: v.astype(cast) if mx.issubdtype(v.dtype, mx.floating) else v
                   for k, v in weights.items()}
    weights, mtp = split_mtp({k: v for k, v in weights.items() if "rotary_emb" not in k})
    if args.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise ModelLoadError(f"weights in {path} do not match the {args.model_type} layout: {e}") from None
    del weights  # the model holds them: each array fuse() moves is freed as it goes
    mx.eval(model.parameters())
    if rounded:
        object.__setattr__(model, "rounded", rounded)
    if keep_quantized and native_enabled():  # the CPU's native products: 4 and 8 bits
        widened = widen_for_native(model)
        joined = sum(match_widths(mods) for block in model.model.layers
                     if isinstance(block, FusedForms) for mods in _joined_products(block))
        if joined:
            widened[(4, 8)] = widened.get((4, 8), 0) + joined
        object.__setattr__(model, "widened", widened)
    model.fuse()
    tokenizer = Tokenizer.from_dir(path)
    return Target(model, tokenizer, path, dtype if dtype != "auto" else "native", keep_quantized,
                  mtp)


def _joined_products(block) -> list[list[nn.Module]]:
    """The layers a fused block joins into one product each (q/k/v, gate/up), where alike
    widths would give it its fused form (``fused_block.quantized_products``, and nothing else
    refusing it: ``fused_block.refuses``); none otherwise, so that nothing is re-packed for a
    block that would keep the module path."""
    groups = quantized_products(block)
    if groups is None or refuses(block):
        return []
    qkv, _, gate_up, _ = groups
    return [qkv, gate_up]


Q6K_ENV = "EDGESPEC_Q6K"
ROUNDED_BITS, ROUNDED_GROUP = 8, 32


def _q6k_rounds() -> bool:
    """``EDGESPEC_Q6K``: "8" or unset rounds a kept-quantized model's Q6_K matrices to 8 bits,
    "float" keeps them float32; any other value is a ModelLoadError naming it."""
    value = os.environ.get(Q6K_ENV, "8") or "8"
    if value not in ("8", "float"):
        raise ModelLoadError(f"{Q6K_ENV}={value!r} is not one of 8, float")
    return value == "8"


def _round_decoded(weights: dict, decoded: dict, quant: dict | None):
    """Round the converter's float32 decodings of GGUF types MLX cannot hold (``decoded``:
    module -> type name, config.json's ``gguf_decoded_dense``) to 8-bit affine groups of 32 in
    ``weights``, in place. Returns the quantization config with those modules added (made if
    the file had no other quantized layer and one was rounded) and {type: modules}."""
    rounded: dict[str, list[str]] = {}
    overrides = {}
    for module, kind in decoded.items():
        w = weights.get(f"{module}.weight")
        if w is None or w.ndim != 2 or w.shape[-1] % ROUNDED_GROUP:
            continue  # not a matrix MLX groups by 32: it stays float32
        packed, scales, biases = round_to_8_bits(w)
        weights[f"{module}.weight"] = packed
        weights[f"{module}.scales"], weights[f"{module}.biases"] = scales, biases
        overrides[module] = {"group_size": ROUNDED_GROUP, "bits": ROUNDED_BITS}
        rounded.setdefault(kind, []).append(module)
    if overrides:
        quant = {**(quant or {"group_size": ROUNDED_GROUP, "bits": ROUNDED_BITS}), **overrides}
    return quant, rounded


def round_to_8_bits(w: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """(rows, cols) float weights as MLX's 8-bit affine triplet, groups of 32: each group's
    scale is its span / 255 and its bias its minimum, so every weight is within half a scale of
    its value (a constant group exactly). Min-max rather than ``mx.quantize``'s rounding, which
    makes the group's larger end exact and may stretch the step: this bound holds for every
    group."""
    rows, cols = w.shape
    g = w.astype(mx.float32).reshape(rows, cols // ROUNDED_GROUP, ROUNDED_GROUP)
    lo, hi = g.min(axis=-1, keepdims=True), g.max(axis=-1, keepdims=True)
    scales = (hi - lo) / 255.0
    q = mx.where(scales > 0, mx.round((g - lo) / mx.where(scales > 0, scales, 1.0)), 0.0)
    packed = mx.clip(q, 0, 255).astype(mx.uint8).reshape(rows, cols).view(mx.uint32)
    return packed, scales.squeeze(-1), lo.squeeze(-1)


def _read_config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path} has no config.json; expected a model directory "
                             "(config.json, *.safetensors, tokenizer files)") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path / 'config.json'} is not valid JSON: {e}") from None


def _read_weights(path: Path) -> dict[str, mx.array]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no *.safetensors weight files")
    weights: dict[str, mx.array] = {}
    for f in files:
        try:
            weights.update(mx.load(str(f)))
        except Exception as e:  # mlx raises RuntimeError/ValueError for unreadable files
            raise ModelLoadError(f"cannot read weights {f}: {e}") from None
    return weights


def _quant_params(quant: dict, name: str) -> tuple[int, int]:
    own = quant.get(name, quant.get("language_model." + name))  # or a text_config model's
    own = own if isinstance(own, dict) else {}
    return own.get("group_size", quant.get("group_size", 64)), own.get("bits", quant.get("bits", 4))


def _quant_mode(quant: dict, name: str) -> str:
    """A layer's quantization mode: affine (scales and biases), or mxfp4 and the other
    microscaled ones (uint8 shared exponents, no biases: mlx-community's gpt-oss). A layer's
    own entry without a mode is affine, as mlx-lm reads it (the 8-bit routers of an MXFP4
    gpt-oss)."""
    own = quant.get(name, quant.get("language_model." + name))
    return own.get("mode", "affine") if isinstance(own, dict) else quant.get("mode", "affine")


def _mlx_quantization(quant: dict | None) -> dict | None:
    """Hugging Face's ``quantization_config`` of OpenAI's MXFP4 checkpoints (quant_method mxfp4:
    the experts' ``*_blocks``/``*_scales``, which the family's sanitize renames) as mlx-lm's."""
    if quant is not None and quant.get("quant_method") == "mxfp4":
        return {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    return quant


def _dequantize(weights: dict, quant: dict, dtype) -> dict[str, mx.array]:
    out = {}
    for k, v in weights.items():
        if k.endswith((".scales", ".biases")) and k.rsplit(".", 1)[0] + ".weight" in weights:
            continue
        base = k.rsplit(".", 1)[0]
        if k.endswith(".weight") and base + ".scales" in weights:
            gs, bits = _quant_params(quant, base)
            mode = _quant_mode(quant, base)
            biases = weights.get(base + ".biases")  # computed in ``dtype``: float16 scales
            scales = weights[base + ".scales"]  # (GGUF's) would round; mxfp4's are exponents
            v = mx.dequantize(v, scales.astype(dtype) if mode == "affine" else scales,
                              None if biases is None else biases.astype(dtype),
                              group_size=gs, bits=bits, mode=mode)
        out[k] = v
    return out


def _quantize_like(model: Decoder, weights: dict, quant: dict) -> None:
    def predicate(name: str, module: nn.Module):
        if f"{name}.scales" not in weights:
            return False
        gs, bits = _quant_params(quant, name)
        mode = _quant_mode(quant, name)
        return {"group_size": gs, "bits": bits, **({} if mode == "affine" else {"mode": mode})}

    try:
        nn.quantize(model, class_predicate=predicate)
    except ValueError as e:
        raise UnsupportedModelError(f"cannot apply quantization {quant}: {e}") from None
