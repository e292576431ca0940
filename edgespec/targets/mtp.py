"""A checkpoint's own multi-token-prediction (MTP) layer, as a one-layer model the MTP drafter runs.

The published layout (Qwen3.5 / Qwen3.6 and Qwen3-Next; Hugging Face config field
``mtp_num_hidden_layers``, Qwen3-Next's ``num_nextn_predict_layers``; vLLM's
``qwen3_next_mtp.py``): ``mtp.pre_fc_norm_embedding`` and ``mtp.pre_fc_norm_hidden`` (RMSNorms),
``mtp.fc`` (2H -> H, no bias, input ``[embedding; hidden]`` in that order), ``mtp.layers.0.*``
(one decoder layer of the target's full-attention kind: gated attention, and routed experts or a
dense MLP as its weights say) and ``mtp.norm``; the embedding and the LM head are the target's.
Row t takes the target's hidden state at position t and the embedding of token t+1 and predicts
token t+2; its output after ``mtp.norm`` is what the LM head scores and what the next row of a
draft chain takes as its hidden state.

The hidden state is the target's AFTER its final norm (the tensor its own LM head scores), as
vLLM's and SGLang's Qwen3-Next MTP feed it; ``drafters/mtp.py`` applies that norm.

Loading: the families' ``sanitize`` keeps ``mtp.*`` (converted like the rest: Hugging Face's
RMSNorm offsets, per-expert weights stacked); ``load_target`` splits them off (``split_mtp``),
so the target loads without them and keeps them as ``Target.mtp_weights``. ``mtp_target``
builds this module from them when a drafter asks (nothing is built for a target that is not
drafted for this way). DeepSeek-V3 / GLM-4.5 / MiMo ship MTP layers in other layouts: their
families are not run by edgespec.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import mlx.core as mx
import mlx.nn as nn

from ..errors import ConfigError
from ..kernels.matmul import linear
from .decoder import Decoder
from .target import Target

PREFIX = "mtp."
MTP_FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
_NEEDED = ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
           "mtp.norm.weight", "mtp.layers.0.input_layernorm.weight")


def split_mtp(weights: dict[str, mx.array]) -> tuple[dict[str, mx.array], dict[str, mx.array]]:
    """(the model's weights, the ``mtp.*`` ones) of a sanitized checkpoint."""
    rest = {k: v for k, v in weights.items() if not k.startswith(PREFIX)}
    return rest, {k: v for k, v in weights.items() if k.startswith(PREFIX)}


def has_mtp(target: Target) -> bool:
    """Whether ``target``'s checkpoint ships MTP layers edgespec can draft with."""
    return target.args.model_type in MTP_FAMILIES and all(
        k in target.mtp_weights for k in _NEEDED)


def check_mtp(target: Target) -> None:
    """ConfigError naming what is missing unless ``target`` has usable MTP layers."""
    if target.args.model_type not in MTP_FAMILIES:
        raise ConfigError(
            f"method 'mtp' drafts with a checkpoint's own multi-token-prediction layers; model "
            f"{target.name} is {target.args.model_type!r}, and edgespec reads them for "
            f"{', '.join(MTP_FAMILIES)} only; choose another --method (auto, lookup, eagle3, ...)")
    missing = [k for k in _NEEDED if k not in target.mtp_weights]
    if missing:
        raise ConfigError(
            f"method 'mtp' needs the checkpoint's multi-token-prediction weights and model "
            f"{target.name} has {'none' if not target.mtp_weights else 'not all of them'} "
            f"(missing {', '.join(missing)}; mlx-lm's conversions drop them): use a checkpoint "
            f"that keeps the mtp.* weights (the Hugging Face original), or another --method")
    layers = {k.split(".")[2] for k in target.mtp_weights if k.startswith("mtp.layers.")}
    if layers != {"0"}:
        raise ConfigError(f"model {target.name} has {len(layers)} MTP layers "
                          f"({', '.join(sorted(layers))}); method 'mtp' drafts with one "
                          "(mtp.layers.0, the published Qwen layout)")


class MtpModel(Decoder):
    """The MTP layer as a one-layer ``Decoder`` (so ``Target.score`` runs it over its own KV
    cache, from ``hidden`` = ``fuse(...)``): ``model.layers.0`` the MTP decoder layer,
    ``model.norm`` ``mtp.norm``; ``logits`` is the target's LM head after ``mtp.norm``."""

    def __init__(self, args, block: nn.Module, shared: Decoder):
        nn.Module.__init__(self)
        self.args = dataclasses.replace(args, num_hidden_layers=1)
        self.model = nn.Module()
        self.model.layers = [block]
        self.model.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.fc = nn.Linear(2 * args.hidden_size, args.hidden_size, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.huge_page_bytes = 0
        # the target's embedding and head, held as functions (not child modules: not loaded here)
        self._embed = shared.embed
        self._head = partial(linear, shared.output_head())

    def embed(self, tokens: mx.array) -> mx.array:
        return self._embed(tokens)

    def fuse_input(self, tokens: mx.array, hidden: mx.array) -> mx.array:
        """The layer's input rows (N, H): ``fc([norm_e(embed(tokens)); norm_h(hidden)])``,
        ``tokens`` (N,) the next tokens, ``hidden`` (N, H) post-final-norm hidden states."""
        e = self.pre_fc_norm_embedding(self.embed(tokens))
        return self.fc(mx.concatenate([e, self.pre_fc_norm_hidden(hidden)], axis=-1))

    def logits(self, hidden: mx.array) -> mx.array:
        return self._head(self.model.norm(hidden))

    def head(self, normed: mx.array) -> mx.array:
        """The target's LM head over outputs already through ``mtp.norm``."""
        return self._head(normed)

    def fuse(self) -> int:
        return 0


def mtp_block(target: Target, experts: bool) -> nn.Module:
    """The MTP decoder layer: the target family's full-attention layer."""
    from .qwen3_next import block

    a = target.args
    return block(a, a.full_attention_interval - 1, False, experts)


def mtp_target(target: Target) -> Target:
    """The MTP layer of ``target`` as a ``Target`` (its tokenizer, dtype), checked
    (``check_mtp``); quantized where its weights are (bits and group size read off the shapes)."""
    check_mtp(target)
    w = {_own_name(k): v for k, v in target.mtp_weights.items()}
    experts = any(".mlp.switch_mlp." in k for k in w)
    model = MtpModel(target.args, mtp_block(target, experts), target.model)
    if any(k.endswith(".scales") for k in w):
        nn.quantize(model, class_predicate=partial(_quantized_like, w))
    try:
        model.load_weights(list(w.items()), strict=True)
    except ValueError as e:
        raise ConfigError(f"the mtp.* weights of model {target.name} do not match the MTP layout "
                          f"(fc, pre_fc_norm_embedding, pre_fc_norm_hidden, layers.0, norm): "
                          f"{e}") from None
    mx.eval(model.parameters())
    return Target(model, target.tokenizer, target.path, target.dtype, target.quantized)


def _own_name(key: str) -> str:
    """``mtp.layers.0.x`` -> ``model.layers.0.x``, ``mtp.norm`` -> ``model.norm``, the rest
    without ``mtp.``."""
    key = key[len(PREFIX):]
    return "model." + key if key.startswith(("layers.", "norm.")) else key


def _quantized_like(weights: dict, name: str, module: nn.Module):
    if f"{name}.scales" not in weights or not hasattr(module, "to_quantized"):
        return False
    cols = module.weight.shape[-1]
    bits = weights[f"{name}.weight"].shape[-1] * 32 // cols
    return {"group_size": cols // weights[f"{name}.scales"].shape[-1], "bits": bits}
