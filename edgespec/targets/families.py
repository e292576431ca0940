"""Which family file runs a config's ``model_type``, and a clear error for the ones none runs.

Each family is one file in ``targets/`` with a ``ModelArgs`` (``from_dict``) and a ``Model``
(a ``decoder.Decoder``); ``FAMILIES`` maps every model_type it runs to it. ``UNSUPPORTED``
says, for model types people meet on the hub, what edgespec lacks for them and which mlx-lm
module runs them (checked against mlx-lm ``MLX_LM_CHECKED``; ``tests/test_families.py``
checks the installed mlx-lm has each module).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedModelError
from . import (gemma2, gemma3, gemma4, gpt_oss, lfm2, llama, mixtral, phi3, qwen3, qwen3_5,
               qwen3_moe, qwen3_next, smollm3)
from .decoder import Decoder, DecoderArgs


@dataclass(frozen=True)
class Family:
    name: str  # the family file
    args: type[DecoderArgs]
    model: type[Decoder]


_FILES = {"llama": llama, "qwen3": qwen3, "gemma3": gemma3, "gemma2": gemma2, "phi3": phi3,
          "smollm3": smollm3, "gemma4": gemma4, "qwen3_moe": qwen3_moe, "mixtral": mixtral,
          "gpt_oss": gpt_oss, "qwen3_next": qwen3_next, "qwen3_5": qwen3_5, "lfm2": lfm2}
FAMILIES: dict[str, Family] = {
    model_type: Family(name, module.ModelArgs, module.Model)
    for name, module in _FILES.items() for model_type in module.FAMILY
}

MLX_LM_CHECKED = "0.32.2"
_MOE, _VISION, _RECURRENT = ("mixture-of-experts layers", "a vision tower",
                             "recurrent or state-space layers")
_PLANNED = "a dense family not ported yet"
_VLM = ("mlx-vlm runs it with images (pip install mlx-vlm; python -m mlx_vlm.generate --model "
        "PATH --image FILE --prompt TEXT)")
UNSUPPORTED: dict[str, tuple[str, str | None]] = {  # model_type: (what it has, mlx_lm.models
    # module, None where mlx-lm has none)
    "qwen2_moe": (_MOE, "qwen2_moe"), "deepseek_v2": (_MOE, "deepseek_v2"),
    "deepseek_v3": (_MOE, "deepseek_v3"), "phimoe": (_MOE, "phimoe"), "olmoe": (_MOE, "olmoe"),
    "granitemoe": (_MOE, "granitemoe"), "dbrx": (_MOE, "dbrx"),
    "llama4": (_MOE + " and " + _VISION, "llama4"), "glm4_moe": (_MOE, "glm4_moe"),
    "gemma3": (_VISION + " (its text model alone is gemma3_text)", "gemma3"),
    "gemma3n": (_VISION + " and audio", "gemma3n"), "mistral3": (_VISION, "mistral3"),
    "llava": (_VISION, "mistral3"), "pixtral": (_VISION, "pixtral"),
    "qwen2_vl": (_VISION, "qwen2_vl"), "qwen2_5_vl": (_VISION, "qwen2_vl"),
    "qwen3_vl": (_VISION, "qwen3_vl"), "qwen3_vl_moe": (_VISION + " and " + _MOE, "qwen3_vl_moe"),
    "kimi_vl": (_VISION + " and " + _MOE, "kimi_vl"), "llava_next": (_VISION, None),
    "idefics3": (_VISION, None), "smolvlm": (_VISION, None), "paligemma": (_VISION, None),
    "mllama": (_VISION, None),
    "mamba": (_RECURRENT, "mamba"), "mamba2": (_RECURRENT, "mamba2"),
    "falcon_mamba": (_RECURRENT, "mamba"), "recurrent_gemma": (_RECURRENT, "recurrent_gemma"),
    "rwkv7": (_RECURRENT, "rwkv7"), "jamba": (_RECURRENT + " and " + _MOE, "jamba"),
    "falcon_h1": (_RECURRENT, "falcon_h1"), "nemotron_h": (_RECURRENT, "nemotron_h"),
    "lfm2_moe": (_MOE + " (sigmoid-routed, beside lfm2's short convolutions)", "lfm2_moe"),
    "gemma": (_PLANNED, "gemma"), "phi": (_PLANNED, "phi"),
    "phi3small": (_PLANNED + " (block-sparse attention)", "phi3small"),
}


def family_of(config: dict) -> Family:
    """The family that runs ``config`` (a config.json as a dict); UnsupportedModelError naming
    the model_type, what is supported and, where known, which mlx-lm module runs it."""
    model_type = config.get("model_type")
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    supported = ", ".join(sorted(FAMILIES))
    if model_type in UNSUPPORTED:
        what, module = UNSUPPORTED[model_type]
        runs = [f"mlx-lm runs it (mlx_lm.models.{module}, checked with mlx-lm {MLX_LM_CHECKED})"
                ] if module else []
        runs += [_VLM] if _VISION in what else []
        raise UnsupportedModelError(
            f"model_type {model_type!r} ({what}) is not supported by edgespec; supported: "
            f"{supported}. {'; '.join(runs)}")
    raise UnsupportedModelError(f"model_type {model_type!r} is not supported by edgespec; "
                                f"supported: {supported}")


def build_model(args: DecoderArgs) -> Decoder:
    """A new model of ``args``' family (random weights until loaded)."""
    return FAMILIES[args.model_type].model(args)
