"""Derive a small draft model from a target: its first N layers, final norm and LM head.

Used by ``edgespec make-draft`` so that classic draft-model speculation can be measured end to
end on a model that has no published smaller sibling. The result is an ordinary model directory
(same tokenizer, same weight format as the source, quantized tensors kept as they are).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import mlx.core as mx

from ..errors import ConfigError, ModelLoadError

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                    "special_tokens_map.json", "tokenizer.model", "chat_template.jinja")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def truncate_model(src: Path, num_layers: int, out: Path) -> Path:
    """Write the first ``num_layers`` layers of the model in ``src`` to ``out``."""
    src, out = Path(src), Path(out)
    config = json.loads((src / "config.json").read_text())
    if config.get("model_type") in ("gemma4", "gemma4_text"):  # per-layer embeddings of all
        raise ConfigError(  # L layers in one tensor, later layers reading earlier ones' KV
            f"make-draft cannot cut {config['model_type']!r} models (per-layer embeddings, "
            "KV-shared layers); draft with the target's own first layers instead: "
            "--method early-exit")
    total = config["num_hidden_layers"]
    if not (isinstance(num_layers, int) and 1 <= num_layers < total):
        raise ConfigError(f"--layers must be an integer in [1, {total - 1}] for a {total}-layer "
                          f"model, got {num_layers!r}")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"output directory {out} exists and is not empty; choose a new path")
    weights = {}
    for f in sorted(src.glob("*.safetensors")):
        for name, w in mx.load(str(f)).items():
            m = _LAYER.match(name)
            if m is None or int(m.group(1)) < num_layers:
                weights[name] = w
    if not weights:
        raise ModelLoadError(f"{src} has no safetensors weights to copy")
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    config["num_hidden_layers"] = num_layers
    for key in ("layer_types", "no_rope_layers"):  # per-layer lists (gemma, ministral, smollm3)
        if isinstance(config.get(key), list):
            config[key] = config[key][:num_layers]
    config["edgespec_derived_from"] = {"model": str(src), "layers": num_layers, "of": total}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in _TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, out / name)
    return out
