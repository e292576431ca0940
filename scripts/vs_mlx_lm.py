"""Plain decoding, edgespec against mlx-lm, in one process on the same weights.

    python scripts/vs_mlx_lm.py [--model demo] [--weights float32|quantized] [--limit 8]
                                [--max-tokens 128] [--methods none,lookup]

What a user asks first: is edgespec's plain decoding at least as fast as mlx-lm's on the same
weights, and what does speculation add on top of mlx-lm's speed? Both run here, per prompt in
turn (mlx-lm's ``generate_step``, then each edgespec method through its Engine), on the same
prompt token ids (the chat template applied once, by edgespec), greedy, stopping at EOS or
``--max-tokens``. Times include the prefill for both. The table gives medians of per-prompt
tokens/s and each one's ratio to mlx-lm on the same prompt, and how many prompts gave mlx-lm's
tokens exactly (the two forwards round differently, so a rare late divergence is not a bug;
edgespec's methods are checked against edgespec plain in ``edgespec bench``).

``--weights float32``: a float32 copy of the model directory is written once (the quantized
checkpoint dequantized exactly as edgespec's loader does) and both libraries load that copy.
``--weights quantized``: both load the checkpoint as it is (mlx-lm's and edgespec's quantized
matmuls). The prompts are MT-bench's (measuring only; nothing is tuned on them).
Needs mlx-lm (``pip install -e '.[train]'``). Run it on an otherwise idle machine.

MKL's OpenMP threads keep their default 200 ms spin here (``busy_openmp_threads``), as in a
process of mlx-lm's own: mlx-lm's float32 decoding is one MKL product after another, and with
the ``KMP_BLOCKTIME=0`` edgespec sets for itself it was measured much slower, while edgespec's
plain decoding (its products are its own kernels) did not change; so the comparison gives
mlx-lm the setting it would have on its own (see docs/measurements.md, "where a float32 decode
step's time goes").
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import edgespec  # noqa: F401  (first: it loads the optimized BLAS before MLX starts)
import mlx.core as mx

from edgespec.loading._blas import busy_openmp_threads

busy_openmp_threads()  # before the first MKL product: see the module docstring

from edgespec.bench import environment, load_prompts
from edgespec.loading.hub import cache_dir, resolve_model
from edgespec.targets import load_target
from edgespec.targets.load import _dequantize, _read_weights
from side_by_side import EVAL, compare, engine_run, greedy_engine, print_table


def float32_copy(path: Path) -> Path:
    """``path`` with its quantized weights dequantized to float32 (edgespec's own rule), once."""
    config = json.loads((path / "config.json").read_text())
    quant = config.pop("quantization", None) or config.pop("quantization_config", None)
    if quant is None:
        return path
    out = cache_dir() / "compare" / f"{path.name}-float32"
    if (out / "model.safetensors").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    weights = _dequantize(_read_weights(path), quant, mx.float32)
    weights = {k: v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v
               for k, v in weights.items()}
    mx.save_safetensors(str(out / "partial.safetensors"), weights, metadata={"format": "mlx"})
    (out / "partial.safetensors").rename(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for f in path.iterdir():
        if f.name.startswith(("tokenizer", "generation_config", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


def mlx_lm_runner(model, eos: set[int]):
    from mlx_lm.generate import generate_step

    def run(ids: list[int], max_tokens: int) -> tuple[list[int], float]:
        t = time.perf_counter()
        out = []
        for token, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens):
            token = int(token)
            if token in eos:
                break
            out.append(token)
        return out, time.perf_counter() - t
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--weights", choices=("float32", "quantized"), default="float32")
    ap.add_argument("--prompts", default=str(EVAL))
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--methods", default="none,lookup")
    a = ap.parse_args(argv)
    try:
        import mlx_lm
    except ImportError:
        print("needs mlx-lm: pip install -e '.[train]'", file=sys.stderr)
        return 2

    path = resolve_model(a.model)
    if a.weights == "float32":
        path = float32_copy(path)
    target = load_target(path, dtype="float32" if a.weights == "float32" else "auto")
    model, _ = mlx_lm.load(str(path))
    runs = {"mlx-lm": mlx_lm_runner(model, set(target.tokenizer.eos_token_ids))}
    for m in [m.strip() for m in a.methods.split(",") if m.strip()]:
        runs[f"edgespec {m}"] = engine_run(greedy_engine(target, m))
    prompts = load_prompts(a.prompts, a.limit)
    rows = compare("mlx-lm", runs, target.tokenizer, prompts, a.max_tokens)

    env = environment(target, max_tokens=a.max_tokens, num_prompts=len(prompts))
    print(f"{env['device']} ({env['cpu_count']} cores) · BLAS {env['blas']} · {a.weights} weights · "
          f"{len(prompts)} prompts × ≤{a.max_tokens} tokens, greedy; mlx-lm {mlx_lm.__version__}, "
          f"mlx {mx.__version__}")
    print_table(rows, "mlx-lm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
