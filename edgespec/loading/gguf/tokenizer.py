"""The tokenizer of a GGUF file, rebuilt from its ``tokenizer.ggml.*`` metadata as HF ``tokenizers``
files (``tokenizer.json``, ``tokenizer_config.json``, ``generation_config.json``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from ...errors import TokenizerError

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
                "llama3": "llama-bpe", "llama-v3": "llama-bpe", "deepseek-r1-qwen": "qwen2",
                "megrez": "qwen2", "kormo": "qwen2"}
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values

GEMMA_TURNS = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set opening = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set opening = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' }}"
    "{{ (opening if loop.first else '') + (m['content'] | trim) }}{{ '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
"""Gemma's turn format: a turn is ``<start_of_turn>`` + role (the assistant's turns are the
model's) + its text + ``<end_of_turn>``; a system message opens the first user turn. Gemma's
instruction-tuned models answer only in it, and a GGUF may carry no template at all (the Gemma 3
270M file this project's ``gemma3-270m`` shortcut uses has none), so ``tokenizer_files`` gives a
gemma-family file without one this template and ``<end_of_turn>`` as a stop token, where the
generic fallback (ChatML, ``loading/tokenizer.py``) would get no answer at all. A gemma file
with a template of its own but no end-of-turn id stops at ``<end_of_turn>`` too."""
FAMILY_TEMPLATES = {"gemma3": GEMMA_TURNS}
"""``general.architecture`` (of those the converter takes) -> the chat template of a file without
one."""
FAMILY_STOPS = {"gemma3": ("<end_of_turn>",), "qwen2": ("<|im_end|>", "<|endoftext|>"),
                "qwen3": ("<|im_end|>", "<|endoftext|>")}
"""``general.architecture`` -> the tokens every file of the family stops at where its vocabulary
has them, besides its eos/eot/eom ids: a Qwen file's eos is one of its two ends (Hugging Face's
generation config lists both, and llama.cpp stops at either)."""


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
    eos_ids = {ids[k] for k in ("eos", "eot", "eom") if name[k] is not None}
    family = FAMILY_TEMPLATES.get(meta.get("general.architecture"))
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    elif family is not None:
        config["chat_template"] = family
    for stop in FAMILY_STOPS.get(meta.get("general.architecture"), ()):
        if stop in tokens:  # the family's turns end there, template or not
            eos_ids.add(tokens.index(stop))
    eos_ids = sorted(eos_ids)
    generation = {"bos_token_id": ids["bos"] if name["bos"] else None,
                  "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids}
    return {"tokenizer.json": tok.to_str(), "tokenizer_config.json": config,
            "generation_config.json": generation}
