"""GGUF tensors -> HF-named MLX arrays (the weights half of the GGUF conversion; see ``convert.py``).

:func:`~edgespec.loading.gguf.convert.convert_gguf` writes ``config.json`` (HF keys, see
``archs.py``), ``model.safetensors`` or its shards (HF tensor names), ``tokenizer.json``,
``tokenizer_config.json`` and ``generation_config.json`` into a temporary sibling directory and
renames it into place, so an interrupted conversion never leaves a half-written model directory.
Every failure is a typed error naming the file: a corrupt or truncated file ->
:class:`ModelLoadError`; an architecture or tensor type it cannot map ->
:class:`UnsupportedModelError`; tokenizer metadata it cannot rebuild -> :class:`TokenizerError`.

Tensors are read with the ``gguf`` package's reader and decoded here (``blocks.py``; ``mx.load``
fails on a whole file as soon as one tensor has a type it lacks, silently drops others (TQ1_0,
MXFP4) and dequantizes Q4_K wrongly (mlx 0.32)). What we write:

=====================================  ==============================================================
GGUF type                              written as
=====================================  ==============================================================
F32, F16, BF16                         the same dtype, as is
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,    MLX affine triplet ``<stem>.weight`` (uint32, packed),
Q5_K                                   ``<stem>.scales``, ``<stem>.biases``, group size 32, 4/5/8
                                       bits -> kept quantized, dequantizing to the file's values
Q6_K                                   float32 (one scale per 16 weights: no MLX group size),
                                       exactly; the module is listed in config.json's
                                       ``gguf_decoded_dense``, and a load that keeps the
                                       model quantized rounds it to 8 bits (``targets/load.py``)
anything else                          not supported: :class:`UnsupportedModelError`
=====================================  ==============================================================

Quantized tensors stay quantized: ``config["quantization"] = {"group_size": 32, "bits": B}`` with B
the most common width, plus a per-module override for tensors of another width, e.g.
``{"group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}}`` (the mlx-lm
convention). Dense tensors (norms, F32/F16 layers) carry no ``.scales`` and load as plain arrays.

llama.cpp permutes the rows of Q and K for its interleaved RoPE (llama only); :func:`unpermute_rows`
restores the HF order (rows of weight, scales and biases alike), so the output uses HF's half-split
RoPE. Gemma's norms are stored plus one; that is subtracted (``archs.NORM_SHIFT``).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, quants
from tqdm import tqdm

from ...errors import ModelLoadError, UnsupportedModelError
from .archs import (GLOBAL_NAMES, LAYER_NAMES, NORM_SHIFT, PERMUTED_QK, SUPPORTED_ARCHITECTURES,
                    hf_config, hf_name)
from .blocks import AFFINE_BITS, DENSE_DECODED, GROUP_SIZE, to_affine, to_dense

CONVERTER_VERSION = 4
"""Bump when the output of :func:`convert_gguf` changes; hub.py keys its cache on it."""

DENSE_TYPES = (T.F32, T.F16, T.BF16)
DENSE_DECODED_KEY = "gguf_decoded_dense"
"""config.json's record of the matrices decoded to float32 from a type MLX cannot hold (module
-> GGUF type name), so that a load keeping the model quantized can quantize them again
(``targets/load.py``)."""
QUANT_BITS = AFFINE_BITS
SUPPORTED_TYPES = tuple(t.name for t in (*DENSE_TYPES, *AFFINE_BITS, *DENSE_DECODED))
_GLOBAL_NAMES, _LAYER_NAMES = GLOBAL_NAMES, LAYER_NAMES["llama"]  # the llama names (tests)
__all__ = ["CONVERTER_VERSION", "DENSE_DECODED_KEY", "SUPPORTED_ARCHITECTURES", "SUPPORTED_TYPES",
           "convert_tensors", "hf_config", "hf_name", "permute_rows", "quantization_config",
           "read_metadata", "unpermute_rows"]


def permute_rows(w: mx.array, n_head: int) -> mx.array:
    """llama.cpp's Q/K row permutation (convert_hf_to_gguf); the inverse of :func:`unpermute_rows`."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w: mx.array, n_head: int) -> mx.array:
    """Undo llama.cpp's Q/K row permutation: rows (head, pair, half) -> (head, half, pair)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_metadata(path: Path) -> tuple[GGUFReader, dict]:
    """The parsed file and its key/value metadata as Python values; ModelLoadError if corrupt."""
    try:
        reader = GGUFReader(path)
        meta = {key: field.contents() for key, field in reader.fields.items()}
    except (ValueError, IndexError, KeyError, OSError, UnicodeDecodeError) as e:
        raise ModelLoadError(
            f"cannot read GGUF file {path}: {e} (corrupt, truncated or not a GGUF file?)") from e
    return reader, meta


def _check_supported(reader: GGUFReader, meta: dict, path: Path) -> None:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: architecture {arch!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    for t in reader.tensors:
        if t.tensor_type not in (*DENSE_TYPES, *AFFINE_BITS, *DENSE_DECODED):
            raise UnsupportedModelError(
                f"{path}: tensor {t.name!r} has type {t.tensor_type.name}; supported types: "
                f"{', '.join(SUPPORTED_TYPES)}")


def _tensor_parts(tensor, path: Path) -> dict[str, mx.array]:
    """``{"weight": w}`` / ``{"bias": b}`` for dense tensors; weight, scales, biases if quantized."""
    suffix = tensor.name.rpartition(".")[2]
    cols = int(tensor.shape[0])  # GGUF lists the fastest-varying (input) dimension first
    rows = int(np.prod(tensor.shape[1:], dtype=np.int64))
    kind = tensor.tensor_type
    try:
        if kind == T.BF16:
            return {suffix: mx.array(quants.dequantize(tensor.data, T.BF16)).astype(mx.bfloat16)}
        if kind in DENSE_TYPES:
            return {suffix: mx.array(np.asarray(tensor.data))}
        if kind in DENSE_DECODED:
            return {suffix: to_dense(tensor.data, kind, rows, cols)}
        return to_affine(tensor.data, kind, rows, cols)
    except (ValueError, IndexError) as e:  # a block array of the wrong size: a damaged file
        raise ModelLoadError(f"{path}: cannot decode tensor {tensor.name!r} ({kind.name}): {e}") from e


def convert_tensors(reader: GGUFReader, config: dict, path: Path, progress: bool = True,
                    sink=None):
    """HF-named weights and the mlx-lm ``quantization`` config (None when nothing is quantized).
    ``sink(name, array)``: where each array goes as it is decoded (the weights returned are then
    empty), so that a caller can write them out without holding them all."""
    arch = reader.fields["general.architecture"].contents()
    heads = {}
    if arch in PERMUTED_QK:
        heads = {"self_attn.q_proj": config["num_attention_heads"],
                 "self_attn.k_proj": config["num_key_value_heads"]}
    shift = NORM_SHIFT.get(arch, 0.0)
    weights, bits, dense, names = {}, {}, {}, set()
    put = weights.__setitem__ if sink is None else sink
    for tensor in tqdm(reader.tensors, desc=f"converting {path.name}", unit="tensor",
                       file=sys.stderr, disable=not progress):
        module = hf_name(tensor.name, arch, path).rpartition(".")[0]
        n_head = heads.get(module.split(".", 3)[-1])  # "model.layers.N.<this>"; None: not Q/K
        for suffix, array in _tensor_parts(tensor, path).items():
            if n_head is not None:
                array = unpermute_rows(array, n_head)
            if shift and module.endswith("norm") and suffix == "weight":
                array = array - shift
            put(f"{module}.{suffix}", array)
            names.add(f"{module}.{suffix}")
        if tensor.tensor_type in AFFINE_BITS:
            bits[module] = AFFINE_BITS[tensor.tensor_type]
        elif tensor.tensor_type in DENSE_DECODED and len(tensor.shape) == 2:
            dense[module] = tensor.tensor_type.name
    _check_complete(names, config, arch, path)
    if dense:
        config[DENSE_DECODED_KEY] = dict(sorted(dense.items()))
    return weights, quantization_config(bits)


def quantization_config(bits: dict[str, int]) -> dict | None:
    """mlx-lm ``quantization``: the most common width, plus per-module overrides for the others."""
    if not bits:
        return None
    default = Counter(bits.values()).most_common(1)[0][0]
    config: dict = {"group_size": GROUP_SIZE, "bits": default}
    for module, b in sorted(bits.items()):
        if b != default:
            config[module] = {"group_size": GROUP_SIZE, "bits": b}
    return config


def _check_complete(weights, config: dict, arch: str, path: Path) -> None:
    per_layer = [f"{n}.weight" for n in LAYER_NAMES[arch].values()]
    needed = ["model.embed_tokens.weight", "model.norm.weight"] + [
        f"model.layers.{i}.{n}" for i in range(config["num_hidden_layers"]) for n in per_layer]
    missing = [n for n in needed if n not in weights]
    if missing:
        raise ModelLoadError(f"{path}: tensors missing for {len(missing)} weights, "
                             f"e.g. {', '.join(missing[:3])}")
