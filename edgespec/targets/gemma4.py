"""Gemma 4 text (``gemma4_text``; and ``gemma4``, the multimodal checkpoints' text model).

What differs from Gemma 3 (mlx-lm's ``gemma4_text`` is the oracle):

- **Two head sizes.** Sliding layers use ``head_dim`` and the ``sliding_attention`` RoPE;
  global layers ``global_head_dim`` and the ``full_attention`` RoPE (``rope_parameters``: the
  "proportional" kind rotates ``partial_rotary_factor`` of the pairs, the rest get an infinite
  wavelength). Global layers may take keys as values (``attention_k_eq_v``, with
  ``num_global_key_value_heads``). q and k get an RMSNorm per head, v one without a weight;
  attention is unscaled (scale 1).
- **KV shared across layers.** The last ``num_kv_shared_layers`` layers have no k/v projections:
  each reads the keys/values of the last earlier layer of its type (``kv_sources``; the cache's
  ``sources``), so the cache holds one copy, written and committed by the source only.
- **Per-layer inputs.** A second embedding (``embed_tokens_per_layer``: L x P features per token)
  plus a projection of the scaled embedding gives each layer a P-vector per token
  (``layer_inputs``), gated into the residual after the MLP. They depend on the token ids only,
  so an upper-layers-only forward (early exit) computes them from the ids too.
- Plain RMSNorms (the weight itself, not ``1 + w``) around attention and MLP; each block's
  output times a learned ``layer_scalar``; KV-shared layers' MLP twice as wide
  (``use_double_wide_mlp``); final logits soft-capped.
- **MoE option** (``enable_moe_block``): a routed-experts branch beside the dense MLP, each
  output normed, then summed: ``experts.SwitchGLU`` with a GELU gate (rows sorted by expert,
  so a verify reads each chosen expert once); the router RMSNorms (weight ``scale / sqrt(D)``),
  projects, softmaxes the top-k logits and scales each by ``per_expert_scale``. Hugging Face's
  fused ``experts.gate_up_proj`` / ``down_proj`` are split by ``experts.stack_experts``.

The multimodal ``gemma4`` configs nest the text model's fields under ``text_config``; its
weights (``model.language_model.*`` as Hugging Face ships them, ``language_model.model.*`` as
mlx-vlm converts them) are renamed to the text model's and the vision/audio towers are dropped:
edgespec runs the text model (with a warning naming mlx-vlm, which runs images and audio;
multimodal chat input gets an error saying so: ``prompt.check_text_only``, the server's
``convert.py``). Blocks run the module path.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ..errors import UnsupportedModelError
from ..kernels.attention import attend
from .decoder import Decoder, DecoderArgs
from .experts import SwitchGLU, route, stack_experts
from .gemma2 import sliding_windows, softcap
from .gemma3 import pattern_types
from .parts import GatedMLP, Rope, project

FAMILY = ("gemma4_text", "gemma4")
_TOWERS = ("vision_tower", "multi_modal_projector", "audio_tower", "embed_audio", "embed_vision",
           "vision_embedder")
_KV_WEIGHTS = (".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.k_norm")
_DROPPED = ("self_attn.rotary_emb", "input_max", "input_min", "output_max", "output_min")
_ROPE = {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0,
                            "rope_type": "proportional"},
         "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10_000.0,
                               "rope_type": "default"}}


@dataclass
class ModelArgs(DecoderArgs):
    LAYER_TYPES = ("sliding_attention", "full_attention")
    PERIODS = ("sliding_window_pattern",)
    head_dim: int | None = 256
    global_head_dim: int | None = 512
    rms_norm_eps: float = 1e-6
    vocab_size_per_layer_input: int = 262144
    num_global_key_value_heads: int | None = None
    num_kv_shared_layers: int = 20  # mlx-lm's defaults (the E2B model's) where a config is silent
    hidden_size_per_layer_input: int | None = 256
    rope_traditional: bool = False
    rope_parameters: dict | None = None
    sliding_window: int = 512
    sliding_window_pattern: int = 5
    max_position_embeddings: int = 131072
    attention_k_eq_v: bool = False
    final_logit_softcapping: float | None = 30.0
    use_double_wide_mlp: bool = True
    enable_moe_block: bool = False
    num_experts: int | None = None
    top_k_experts: int | None = None
    moe_intermediate_size: int | None = None
    layer_types: list[str] | None = None

    @classmethod
    def from_dict(cls, config: dict) -> ModelArgs:
        """A ``gemma4_text`` config, or a ``gemma4`` one's ``text_config`` (its vocabulary size
        from the outer config where given, as mlx-lm reads it)."""
        if "text_config" in config:
            inner = {"num_attention_heads": 8, "num_key_value_heads": 1,
                     **config["text_config"], "model_type": "gemma4_text"}
            if "vocab_size" in config:
                inner["vocab_size"] = config["vocab_size"]
            config = inner
        return super().from_dict(config)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.rope_parameters = self.rope_parameters or _ROPE
        if self.layer_types is None:
            self.layer_types = pattern_types(self.num_hidden_layers, self.sliding_window_pattern)

    def sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == "sliding_attention"

    def first_shared(self) -> int:
        """The first layer that reads an earlier layer's keys/values (L when none does)."""
        return self.num_hidden_layers - self.num_kv_shared_layers


def kv_sources(a: ModelArgs) -> list[int]:
    """Per layer, itself, or for a KV-shared layer the last non-shared layer of its type."""
    m, last = a.first_shared(), {}
    for i in range(max(m, 0)):
        last[a.layer_types[i]] = i
    shared = [a.layer_types[j] for j in range(m, a.num_hidden_layers)]
    if m <= 0 and shared or any(t not in last for t in shared):
        raise UnsupportedModelError(
            f"num_kv_shared_layers {a.num_kv_shared_layers} of {a.num_hidden_layers} layers leaves "
            f"a shared layer no earlier layer of its type to read (layer_types {a.layer_types})")
    return list(range(max(m, 0))) + [last[t] for t in shared]


def layer_rope(head_dim: int, params: dict, traditional: bool) -> Rope:
    """RoPE of one layer type's ``rope_parameters``: default/linear/llama3 as ``Rope``, or
    "proportional" (the first ``partial_rotary_factor`` of the pairs rotated at
    ``factor * theta ** (2j / head_dim)``, the rest not at all)."""
    theta = params.get("rope_theta", 10_000.0)
    if params.get("type", params.get("rope_type")) != "proportional":
        return Rope.from_config(head_dim, theta, params, traditional)
    rotated = int(head_dim * params.get("partial_rotary_factor", 1.0))
    rotated_freqs = params.get("factor", 1.0) * theta ** (mx.arange(0, rotated, 2) / head_dim)
    freqs = mx.concatenate([rotated_freqs, mx.full(((head_dim - rotated) // 2,), mx.inf)])
    return Rope(head_dim, None, freqs=freqs, traditional=traditional)


class Attention(nn.Module):
    """Gemma 4 attention of layer ``layer``: its own keys/values written to the cache, or (a
    KV-shared layer, ``has_kv`` False) its source's read from it."""

    def __init__(self, a: ModelArgs, layer: int, has_kv: bool):
        super().__init__()
        sliding = a.sliding(layer)
        self.d = a.head_dim if sliding or not a.global_head_dim else a.global_head_dim
        self.k_eq_v = a.attention_k_eq_v and not sliding
        self.h = a.num_attention_heads
        self.kv = (a.num_global_key_value_heads if self.k_eq_v and a.num_global_key_value_heads
                   else a.num_key_value_heads)
        self.has_kv, self.eps = has_kv, a.rms_norm_eps
        params = a.rope_parameters.get("sliding_attention" if sliding else "full_attention", {})
        self.rope = layer_rope(self.d, params, a.rope_traditional)
        self.q_proj = nn.Linear(a.hidden_size, self.h * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, a.hidden_size, bias=False)
        self.q_norm = nn.RMSNorm(self.d, eps=a.rms_norm_eps)
        if has_kv:
            self.k_proj = nn.Linear(a.hidden_size, self.kv * self.d, bias=False)
            if not self.k_eq_v:
                self.v_proj = nn.Linear(a.hidden_size, self.kv * self.d, bias=False)
            self.k_norm = nn.RMSNorm(self.d, eps=a.rms_norm_eps)

    def __call__(self, x, positions, mask, cache, layer: int) -> mx.array:
        B, N, _ = x.shape
        q = self.q_norm(project(self.q_proj, x).reshape(B, N, self.h, self.d))
        q = self.rope(q.transpose(0, 2, 1, 3), positions)
        if self.has_kv:
            k = project(self.k_proj, x).reshape(B, N, self.kv, self.d)
            v = k if self.k_eq_v else project(self.v_proj, x).reshape(B, N, self.kv, self.d)
            k = self.rope(self.k_norm(k).transpose(0, 2, 1, 3), positions)
            v = mx.fast.rms_norm(v, None, self.eps).transpose(0, 2, 1, 3)
            k, v = cache.write(layer, k, v)
        else:
            k, v = cache.read(layer, N)
        out = attend(q, k, v, 1.0, mask)
        return project(self.o_proj, out.transpose(0, 2, 1, 3).reshape(B, N, -1))


class Router(nn.Module):
    """The experts and their weights for each row: RMSNorm (weight ``scale / sqrt(D)``), a
    projection to E logits, the top-k's softmax, times each chosen expert's ``per_expert_scale``."""

    def __init__(self, a: ModelArgs):
        super().__init__()
        if not a.num_experts or not 1 <= (a.top_k_experts or 0) <= a.num_experts \
                or not a.moe_intermediate_size:
            raise UnsupportedModelError(
                f"enable_moe_block needs num_experts, top_k_experts in [1, num_experts] and "
                f"moe_intermediate_size; got {a.num_experts}, {a.top_k_experts}, "
                f"{a.moe_intermediate_size}")
        self.k, self.eps, self.root = a.top_k_experts, a.rms_norm_eps, a.hidden_size**-0.5
        self.proj = nn.Linear(a.hidden_size, a.num_experts, bias=False)
        self.scale = mx.ones((a.hidden_size,))
        self.per_expert_scale = mx.ones((a.num_experts,))

    def __call__(self, x: mx.array) -> tuple[mx.array, mx.array]:
        x = mx.fast.rms_norm(x, self.scale * self.root, self.eps)
        inds, weights = route(project(self.proj, x), self.k, "topk_softmax")
        return inds, weights * self.per_expert_scale[inds]


def _geglu(gate: mx.array, up: mx.array) -> mx.array:
    return nn.gelu_approx(gate) * up


class Experts(nn.Module):
    """sum over the k chosen experts of weight * expert(x), each a GELU-gated MLP
    (``experts.SwitchGLU`` under mlx-lm's name ``switch_glu``)."""

    def __init__(self, a: ModelArgs):
        super().__init__()
        self.top_k = a.top_k_experts  # the read share ``experts.expert_shares`` counts
        self.switch_glu = SwitchGLU(a.hidden_size, a.moe_intermediate_size, a.num_experts, _geglu)

    def __call__(self, x: mx.array, inds: mx.array, weights: mx.array) -> mx.array:
        return (self.switch_glu(x, inds) * weights[..., None].astype(x.dtype)).sum(axis=-2)


class Block(nn.Module):
    """h = x + norm(attn(norm(x))); h + norm(mlp(norm(h))) (MoE: the dense MLP's and the
    experts' outputs, each normed, summed first); then the per-layer input gated in
    (h + norm(proj(gelu(gate(h)) * p))); all times ``layer_scalar``."""

    def __init__(self, a: ModelArgs, layer: int):
        super().__init__()
        shared = layer >= a.first_shared() > 0
        self.self_attn = Attention(a, layer, has_kv=not shared)
        wide = 2 if a.use_double_wide_mlp and shared else 1
        self.mlp = GatedMLP(a.hidden_size, a.intermediate_size * wide, nn.gelu_approx)
        norm = lambda: nn.RMSNorm(a.hidden_size, eps=a.rms_norm_eps)  # noqa: E731
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()
        self.moe = a.enable_moe_block
        if self.moe:
            self.router, self.experts = Router(a), Experts(a)
            self.post_feedforward_layernorm_1, self.post_feedforward_layernorm_2 = norm(), norm()
            self.pre_feedforward_layernorm_2 = norm()
        if a.hidden_size_per_layer_input:
            self.per_layer_input_gate = nn.Linear(a.hidden_size, a.hidden_size_per_layer_input,
                                                  bias=False)
            self.per_layer_projection = nn.Linear(a.hidden_size_per_layer_input, a.hidden_size,
                                                  bias=False)
            self.post_per_layer_input_norm = norm()
        self.layer_scalar = mx.ones((1,))

    def __call__(self, x, positions, mask, cache, layer, per_layer=None):
        h = x + self.post_attention_layernorm(
            self.self_attn(self.input_layernorm(x), positions, mask, cache, layer))
        r = self.mlp(self.pre_feedforward_layernorm(h))
        if self.moe:
            e = self.experts(self.pre_feedforward_layernorm_2(h), *self.router(h))
            r = self.post_feedforward_layernorm_1(r) + self.post_feedforward_layernorm_2(e)
        h = h + self.post_feedforward_layernorm(r)
        if per_layer is not None:
            g = nn.gelu_approx(project(self.per_layer_input_gate, h)) * per_layer
            h = h + self.post_per_layer_input_norm(project(self.per_layer_projection, g))
        return h * self.layer_scalar

    def fuse(self) -> bool:
        return False  # the module path only

    def streamed(self) -> list[mx.array]:
        return []


class Model(Decoder):
    def __init__(self, args: ModelArgs):
        kv_sources(args)  # UnsupportedModelError now, for a sharing no layer can serve
        blocks = [Block(args, i) for i in range(args.num_hidden_layers)]
        super().__init__(args, blocks, nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps))
        L, P = args.num_hidden_layers, args.hidden_size_per_layer_input
        if P:
            self.model.embed_tokens_per_layer = nn.Embedding(args.vocab_size_per_layer_input, L * P)
            self.model.per_layer_model_projection = nn.Linear(args.hidden_size, L * P, bias=False)
            self.model.per_layer_projection_norm = nn.RMSNorm(P, eps=args.rms_norm_eps)

    def embed(self, tokens: mx.array) -> mx.array:
        return self.model.embed_tokens(tokens) * math.sqrt(self.args.hidden_size)

    def layer_inputs(self, tokens: mx.array) -> mx.array | None:
        """(1, N, L, P): (norm(projection of the scaled embedding) + the per-layer embedding
        scaled by sqrt(P)) / sqrt(2); None without per-layer inputs."""
        a, m = self.args, self.model
        L, P = a.num_hidden_layers, a.hidden_size_per_layer_input
        if not P:
            return None
        own = m.embed_tokens_per_layer(tokens) * math.sqrt(P)
        proj = project(m.per_layer_model_projection, self.embed(tokens)) * a.hidden_size**-0.5
        proj = m.per_layer_projection_norm(proj.reshape(*proj.shape[:-1], L, P))
        return (proj + own.reshape(*own.shape[:-1], L, P)) * 2**-0.5

    def logits(self, hidden: mx.array) -> mx.array:
        return softcap(super().logits(hidden), self.args.final_logit_softcapping)

    def cache_windows(self) -> list[int | None]:
        return sliding_windows(self.args)

    def kv_sources(self) -> list[int]:
        return kv_sources(self.args)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """The text model's weights under its own names: nested ``gemma4`` names renamed, the
        vision/audio towers and the k/v weights a KV-shared layer never uses dropped."""
        shared, towers = self.args.first_shared(), 0
        out = {}
        for k, v in weights.items():
            k = _text_name(k)
            towers += k is None
            if k is None or any(s in k for s in _DROPPED):
                continue
            if any(s in k for s in _KV_WEIGHTS) and int(k.split("layers.")[1].split(".")[0]) >= shared:
                continue
            out[k] = v
        if self.args.enable_moe_block:  # HF's fused experts.gate_up_proj / down_proj
            out = stack_experts(out, self.args.num_experts, src="experts", dst="experts.switch_glu")
        if towers:
            warnings.warn(f"gemma4: {towers} vision/audio tower tensors not loaded; edgespec runs "
                          "the text model (mlx-vlm runs images and audio: python -m "
                          "mlx_vlm.generate --model PATH --image FILE --prompt TEXT)", stacklevel=2)
        return out


def _text_name(k: str) -> str | None:
    """The text model's name for checkpoint weight ``k``; None for a vision/audio tower's."""
    for prefix, to in (("model.language_model.", "model."), ("language_model.model.", "model."),
                       ("language_model.", "")):
        if k.startswith(prefix):
            return to + k[len(prefix):]
    if k.removeprefix("model.").startswith(_TOWERS):
        return None
    return k
