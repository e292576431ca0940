"""Qwen3.5 / Qwen3.6, dense (``qwen3_5``) and mixture-of-experts (``qwen3_5_moe``): Qwen3-Next's
hybrid (``qwen3_next.py``: gated DeltaNet layers, gated full attention every
``full_attention_interval``-th layer, partial rotary) with the DeltaNet's projections split
(``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``), RoPE settings under
``rope_parameters``, and the text model's fields nested under ``text_config`` (the checkpoints
are multimodal: ``vision_config`` beside it). The MoE form has routed experts plus a gated
shared expert on every layer.

edgespec runs the text model: the vision tower's weights (``model.visual.*``,
``vision_tower.*``) are dropped and images are not taken (mlx-vlm runs them). Weight names as
Hugging Face ships them (``model.language_model.*``, ``lm_head``) or mlx-lm converts them
(``language_model.model.*``, ``language_model.lm_head``) become the text model's.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ..errors import ModelLoadError
from . import qwen3_next
from .decoder import Decoder
from .experts import stack_experts
from .qwen3_next import block, from_hugging_face

FAMILY = ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text")
_DROPPED = ("model.visual", "vision_tower")


@dataclass
class ModelArgs(qwen3_next.ModelArgs):
    rope_theta: float = 100000.0
    max_position_embeddings: int = 131072
    norm_topk_prob: bool = True
    rope_parameters: dict | None = None

    @classmethod
    def from_dict(cls, config: dict) -> ModelArgs:
        """A flat config or one nesting the text model under ``text_config`` (read from there
        only, as mlx-lm does); the model type stays the outer one."""
        if "text_config" in config:
            config = {**config["text_config"], "model_type": config["model_type"]}
        return super().from_dict(config)

    def __post_init__(self) -> None:
        super().__post_init__()
        flat = {"rope_theta": self.rope_theta, "partial_rotary_factor": self.partial_rotary_factor}
        p = dict(self.rope_parameters or flat)  # a config without rope_parameters: its flat keys
        if "type" not in p and "rope_type" in p:
            p["type"] = p.pop("rope_type")
        self.partial_rotary_factor = p.get("partial_rotary_factor", 0.25)
        self.rope_theta = p.get("rope_theta", 100000.0)
        self.rope_scaling = p

    def sparse(self, i: int) -> bool:
        return self.num_experts > 0


class Model(Decoder):
    def __init__(self, args: ModelArgs):
        blocks = [block(args, i, False, args.sparse(i)) for i in range(args.num_hidden_layers)]
        super().__init__(args, blocks, nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps))

    def state_layers(self) -> list[int]:
        return [i for i in range(self.args.num_hidden_layers) if self.args.linear(i)]

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """The text model's weights under its own names; the vision tower dropped; ``mtp.*``
        (the MTP layer, ``model.mtp.*`` too) kept as ``mtp.*`` for ``targets/mtp.py``; experts
        stacked; Hugging Face's norm offsets and conv layout converted."""
        out = {}
        for k, v in weights.items():
            for prefix in ("model.language_model.", "language_model.model."):
                if k.startswith(prefix):
                    k = "model." + k[len(prefix):]
            if k.startswith("language_model."):
                k = k[len("language_model."):]
            if k.startswith("model.mtp."):
                k = k[len("model."):]
            if not k.startswith(_DROPPED):
                out[k] = v
        if not any(k.startswith("model.layers.") for k in out):
            raise ModelLoadError(
                f"this {self.args.model_type} checkpoint has no text-model weights "
                "(model.language_model.layers.* or language_model.model.layers.*), only "
                f"{sorted({'.'.join(k.split('.')[:2]) for k in weights})[:4]}: "
                "edgespec runs the text model only; mlx-vlm runs the whole checkpoint (pip "
                "install mlx-vlm; python -m mlx_vlm.generate --model PATH --image FILE "
                "--prompt TEXT)")
        return from_hugging_face(stack_experts(out, self.args.num_experts or 1), out)
