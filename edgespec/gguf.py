"""Convert a llama-architecture GGUF file into an edgespec model directory (HF / mlx-lm layout).

Contract: :func:`convert_gguf` writes ``config.json`` (HF llama keys), ``model.safetensors`` (HF
tensor names), ``tokenizer.json``, ``tokenizer_config.json`` and ``generation_config.json`` into a
temporary sibling directory and renames it into place, so an interrupted conversion never leaves a
half-written model directory. Every failure is a typed error naming the file: a corrupt or truncated
file -> :class:`ModelLoadError`; an architecture or tensor type it cannot map ->
:class:`UnsupportedModelError`; tokenizer metadata it cannot rebuild -> :class:`TokenizerError`.

Tensors are read with ``mx.load`` (MLX parses GGUF natively); types are checked first with the
``gguf`` package's reader, because ``mx.load`` fails on some types without naming the tensor,
silently drops others (TQ1_0, MXFP4) and dequantizes Q4_K wrongly (mlx 0.32). What it returns:

====================  =========================================================================
GGUF type             ``mx.load`` result -> what we write
====================  =========================================================================
F32, F16              float32 / float16 array -> written as is
BF16                  float16 (lossy) -> re-read with ``gguf`` and written as bfloat16
Q4_0, Q4_1, Q8_0      MLX affine triplet ``<stem>.weight`` (uint32, packed), ``<stem>.scales``,
                      ``<stem>.biases`` (float16), group size 32, 4/4/8 bits -> kept quantized
anything else         not supported: :class:`UnsupportedModelError`
====================  =========================================================================

Quantized tensors stay quantized: ``config["quantization"] = {"group_size": 32, "bits": B}`` with B
the most common width, plus a per-module override for tensors of another width, e.g.
``{"group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}}`` (the mlx-lm
convention). Dense tensors (norms, F32/F16 layers) carry no ``.scales`` and load as plain arrays.

llama.cpp permutes the rows of Q and K for its interleaved RoPE; :func:`unpermute_rows` restores the
HF order (rows of weight, scales and biases alike), so the output uses HF's half-split RoPE.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np
import tokenizers
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, quants
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors
from tqdm import tqdm

from .errors import ModelLoadError, TokenizerError, UnsupportedModelError

CONVERTER_VERSION = 1
"""Bump when the output of :func:`convert_gguf` changes; hub.py keys its cache on it."""

SUPPORTED_ARCHITECTURES = ("llama",)
GROUP_SIZE = 32
QUANT_BITS = {T.Q4_0: 4, T.Q4_1: 4, T.Q8_0: 8}
DENSE_TYPES = (T.F32, T.F16, T.BF16)
SUPPORTED_TYPES = tuple(t.name for t in (*DENSE_TYPES, *QUANT_BITS))

_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def hf_name(gguf_name: str, path: Path | str = "<gguf>") -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (and globals)."""
    stem, _, suffix = gguf_name.rpartition(".")
    parts = stem.split(".")
    if suffix in ("weight", "bias"):
        if len(parts) == 1 and stem in _GLOBAL_NAMES:
            return f"{_GLOBAL_NAMES[stem]}.{suffix}"
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
            return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    known = ", ".join([*_GLOBAL_NAMES, *(f"blk.N.{n}" for n in _LAYER_NAMES)])
    raise UnsupportedModelError(
        f"{path}: tensor {gguf_name!r} has no llama equivalent; known tensors: {known}")


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
        if t.tensor_type not in DENSE_TYPES and t.tensor_type not in QUANT_BITS:
            raise UnsupportedModelError(
                f"{path}: tensor {t.name!r} has type {t.tensor_type.name}; supported types: "
                f"{', '.join(SUPPORTED_TYPES)}")


def _number(value):
    """A metadata number as a plain int/float (float32 values printed at their shortest)."""
    if isinstance(value, float):
        return float(str(np.float32(value)))
    return value


def hf_config(meta: dict, tensor_names: set[str], path: Path) -> dict:
    """HF llama ``config.json`` from the GGUF hyperparameters."""
    arch = meta["general.architecture"]

    def get(key, default=...):
        value = meta.get(f"{arch}.{key}", default)
        if value is ...:
            raise ModelLoadError(f"{path}: metadata key {arch}.{key!r} is missing")
        if isinstance(value, list):
            raise UnsupportedModelError(f"{path}: per-layer {arch}.{key} is not supported")
        return _number(value)

    hidden, heads = get("embedding_length"), get("attention.head_count")
    head_dim = get("attention.key_length", hidden // heads)
    if get("rope.dimension_count", head_dim) != head_dim:
        raise UnsupportedModelError(f"{path}: partial rotary embeddings "
                                    f"({get('rope.dimension_count')} of {head_dim} dims) are not supported")
    vocab = get("vocab_size", None) or len(meta.get("tokenizer.ggml.tokens") or ())
    if not vocab:
        raise ModelLoadError(f"{path}: neither {arch}.vocab_size nor tokenizer.ggml.tokens is present")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": hidden, "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length"), "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads), "head_dim": head_dim,
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon"),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_position_embeddings": get("context_length", 2048), "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names, "mlp_bias": False,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    scaling = get("rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": get("rope.scaling.factor")}
    elif scaling != "none":
        raise UnsupportedModelError(f"{path}: rope scaling {scaling!r} is not supported (linear only)")
    return config


def _load_arrays(path: Path) -> dict[str, mx.array]:
    try:
        return mx.load(str(path))
    except (RuntimeError, ValueError, OSError) as e:
        raise ModelLoadError(f"cannot read the tensors of {path}: {e}") from e


def _tensor_parts(tensor, arrays: dict, path: Path) -> dict[str, mx.array]:
    """``{"weight": w}`` / ``{"bias": b}`` for dense tensors; weight, scales, biases if quantized."""
    stem, _, suffix = tensor.name.rpartition(".")
    try:
        if tensor.tensor_type == T.BF16:  # mx.load would round it to float16
            return {suffix: mx.array(quants.dequantize(tensor.data, T.BF16)).astype(mx.bfloat16)}
        if tensor.tensor_type in DENSE_TYPES:
            return {suffix: arrays[tensor.name]}
        return {"weight": arrays[tensor.name], "scales": arrays[f"{stem}.scales"],
                "biases": arrays[f"{stem}.biases"]}
    except KeyError as e:
        raise ModelLoadError(f"{path}: MLX did not return tensor {e} ({tensor.tensor_type.name})") from e


def convert_tensors(reader: GGUFReader, config: dict, path: Path, progress: bool = True):
    """HF-named weights and the mlx-lm ``quantization`` config (None when nothing is quantized)."""
    arrays = _load_arrays(path)
    heads = {"self_attn.q_proj": config["num_attention_heads"],
             "self_attn.k_proj": config["num_key_value_heads"]}
    weights, bits = {}, {}
    for tensor in tqdm(reader.tensors, desc=f"converting {path.name}", unit="tensor",
                       file=sys.stderr, disable=not progress):
        module = hf_name(tensor.name, path).rpartition(".")[0]
        n_head = heads.get(module.split(".", 3)[-1])  # "model.layers.N.<this>"; None: not Q/K
        for suffix, array in _tensor_parts(tensor, arrays, path).items():
            weights[f"{module}.{suffix}"] = array if n_head is None else unpermute_rows(array, n_head)
        if tensor.tensor_type in QUANT_BITS:
            bits[module] = QUANT_BITS[tensor.tensor_type]
    _check_complete(weights, config, path)
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


def _check_complete(weights: dict, config: dict, path: Path) -> None:
    per_layer = [f"{n}.weight" for n in _LAYER_NAMES.values()]
    needed = ["model.embed_tokens.weight", "model.norm.weight"] + [
        f"model.layers.{i}.{n}" for i in range(config["num_hidden_layers"]) for n in per_layer]
    missing = [n for n in needed if n not in weights]
    if missing:
        raise ModelLoadError(f"{path}: tensors missing for {len(missing)} weights, "
                             f"e.g. {', '.join(missing[:3])}")


def _write_atomically(out: Path, weights: dict, files: dict[str, object]) -> None:
    """Write into a temporary sibling of ``out`` and rename it into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        for name, content in files.items():
            text = content if isinstance(content, str) else json.dumps(content, indent=2,
                                                                        ensure_ascii=False)
            (tmp / name).write_text(text, encoding="utf-8")
        tmp.chmod(0o755)  # mkdtemp makes it private; a model directory is ordinary data
        if out.is_dir():
            out.rmdir()  # empty (checked by the caller); a rename cannot replace a directory
        os.rename(tmp, out)
    except OSError as e:  # disk full, or another process created ``out`` first
        raise ModelLoadError(f"cannot write the model directory {out}: {e}") from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, *, progress: bool = True) -> Path:
    """Convert the llama GGUF file ``gguf_path`` into the new model directory ``out_dir``.

    ``out_dir`` must not exist or be empty. Returns ``out_dir``. See the module docstring for the
    tensor types, the quantization config and the errors raised.
    """
    path, out = Path(gguf_path).expanduser(), Path(out_dir).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"no such GGUF file: {path}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelLoadError(f"output directory {out} already exists and is not empty; "
                             "remove it or choose another")
    reader, meta = read_metadata(path)
    _check_supported(reader, meta, path)
    config = hf_config(meta, {t.name for t in reader.tensors}, path)
    files = tokenizer_files(meta, path)
    weights, quantization = convert_tensors(reader, config, path, progress)
    if quantization:
        config["quantization"] = quantization
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(out, weights, {"config.json": config, **files})
    return out


# -- the tokenizer, rebuilt from the tokenizer.ggml.* metadata ---------------------------------

_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZER_REGEXES = {
    "gpt-2": (_GPT2_RE,),
    "smollm": (r"\p{N}", _GPT2_RE),  # = HF's Digits(individual_digits) + ByteLevel(use_regex)
    "llama-bpe": (_LLAMA3_RE,),
    "qwen2": (_LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}"),),
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_RE, r"\p{N}+", r"[0-9][0-9][0-9]"),
}
"""llama.cpp's pre-tokenizer splits by ``tokenizer.ggml.pre`` (llama-vocab.cpp): each regex splits
the pieces of the previous one, matches and gaps kept (HF ``Split(..., "isolated")``)."""
_PRE_ALIASES = {"gpt2": "gpt-2", "starcoder": "smollm", "refact": "smollm", "codeshell": "smollm",
                "llama3": "llama-bpe", "llama-v3": "llama-bpe"}
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values


def _byte_level_bpe(meta: dict, tokens: list[str], vocab: dict, path: Path) -> tokenizers.Tokenizer:
    """GPT-2 style byte-level BPE (``tokenizer.ggml.model == "gpt2"``)."""
    pre = meta.get("tokenizer.ggml.pre") or "default"
    regexes = PRE_TOKENIZER_REGEXES.get(_PRE_ALIASES.get(pre, pre))
    if regexes is None:
        raise TokenizerError(f"{path}: pre-tokenizer {pre!r} is not supported; supported: "
                             f"{', '.join([*PRE_TOKENIZER_REGEXES, *_PRE_ALIASES])}")
    merges = []
    for merge in meta.get("tokenizer.ggml.merges") or ():
        cut = merge.find(" ", 1)  # as llama.cpp: the first space after the first character
        if cut < 0:
            raise TokenizerError(f"{path}: malformed merge {merge!r} in tokenizer.ggml.merges")
        merges.append((merge[:cut], merge[cut + 1:]))
    if not merges:
        raise TokenizerError(f"{path}: byte-level BPE vocabulary without tokenizer.ggml.merges")
    tok = tokenizers.Tokenizer(models.BPE(vocab, merges, ignore_merges=regexes == (_LLAMA3_RE,)))
    splits = [pre_tokenizers.Split(tokenizers.Regex(r), "isolated") for r in regexes]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(meta: dict, tokens: list[str], vocab: dict, path: Path) -> tokenizers.Tokenizer:
    """SentencePiece BPE (``tokenizer.ggml.model == "llama"``) as HF's legacy Llama tokenizer.json.

    SentencePiece merges the pair whose merged piece scores highest; the equivalent BPE merge list
    ranks every split of every piece into two vocabulary pieces by the merged piece's score.
    """
    scores = meta.get("tokenizer.ggml.scores")
    if not scores or len(scores) != len(tokens):
        raise TokenizerError(f"{path}: SentencePiece vocabulary without tokenizer.ggml.scores")
    ranked = sorted((-scores[i], vocab[piece[:k]], vocab[piece[k:]], piece[:k], piece[k:])
                    for i, piece in enumerate(tokens) for k in range(1, len(piece))
                    if piece[:k] in vocab and piece[k:] in vocab)
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    tok = tokenizers.Tokenizer(models.BPE(
        vocab, [(left, right) for *_, left, right in ranked], fuse_unk=True, byte_fallback=True,
        unk_token=tokens[unk] if unk is not None else None))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    tok.normalizer = normalizers.Sequence(
        ([normalizers.Prepend("▁")] if prefix else []) + [normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def _post_processor(tok: tokenizers.Tokenizer, bos: str | None, eos: str | None,
                    add_bos: bool, add_eos: bool):
    """Template adding BOS/EOS when the file asks for them; otherwise ByteLevel, which only fixes
    offsets (HF's choice for byte-level BPE, harmless for SentencePiece)."""
    first = [bos] if add_bos and bos else []
    last = [eos] if add_eos and eos else []
    if not first and not last:
        return processors.ByteLevel(trim_offsets=False)
    return processors.TemplateProcessing(
        single=[*first, "$A", *last], pair=[*first, "$A", *last, *first, "$B:1", *last],
        special_tokens=[(t, tok.token_to_id(t)) for t in {*first, *last}])


def build_tokenizer(meta: dict, path: Path) -> tokenizers.Tokenizer:
    """The HF tokenizer of the GGUF vocabulary: model, pre-tokenizer, decoder, added tokens."""
    kind, tokens = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.tokens")
    builders = {"gpt2": _byte_level_bpe, "llama": _sentencepiece_bpe}
    if kind not in builders or not tokens:
        raise TokenizerError(
            f"{path}: cannot rebuild the tokenizer: tokenizer.ggml.model is {kind!r} with "
            f"{len(tokens or ())} tokens; supported vocabularies: {', '.join(builders)}")
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        dup = next(t for t, n in Counter(tokens).items() if n > 1)
        raise TokenizerError(f"{path}: token {dup!r} occurs twice in tokenizer.ggml.tokens")
    tok = builders[kind](meta, tokens, vocab, path)
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == _CONTROL])
    tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == _USER_DEFINED])
    return tok


def tokenizer_files(meta: dict, path: Path) -> dict[str, object]:
    """``tokenizer.json`` (text), ``tokenizer_config.json`` and ``generation_config.json``."""
    tok = build_tokenizer(meta, path)
    tokens = meta["tokenizer.ggml.tokens"]
    ids = {k: meta.get(f"tokenizer.ggml.{k}_token_id") for k in
           ("bos", "eos", "unknown", "padding", "eot", "eom")}
    name = {k: tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None
            for k, i in ids.items()}
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", meta["tokenizer.ggml.model"] == "llama"))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    tok.post_processor = _post_processor(tok, name["bos"], name["eos"], add_bos, add_eos)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": add_bos,
              "add_eos_token": add_eos, "bos_token": name["bos"], "eos_token": name["eos"],
              "unk_token": name["unknown"], "pad_token": name["padding"],
              "clean_up_tokenization_spaces": False}
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    eos_ids = sorted({ids[k] for k in ("eos", "eot", "eom") if name[k] is not None})
    generation = {"bos_token_id": ids["bos"] if name["bos"] else None,
                  "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids}
    return {"tokenizer.json": tok.to_str(), "tokenizer_config.json": config,
            "generation_config.json": generation}
