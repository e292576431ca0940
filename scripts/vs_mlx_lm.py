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
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import edgespec  # noqa: F401  (first: it loads the optimized BLAS before MLX starts)
import mlx.core as mx
from tqdm import tqdm

from edgespec.bench import environment, load_prompts
from edgespec.config import SamplingConfig
from edgespec.drafters.registry import make_drafter
from edgespec.engine import Engine
from edgespec.loading.hub import cache_dir, resolve_model
from edgespec.options import spec_for
from edgespec.prompt import encode_prompt
from edgespec.targets import load_target
from edgespec.targets.load import _dequantize, _read_weights

EVAL = Path(__file__).resolve().parents[1].parent / "shared" / "eval" / "mt_bench.jsonl"


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


def mlx_lm_run(model, ids: list[int], max_tokens: int, eos: set[int]) -> tuple[list[int], float]:
    from mlx_lm.generate import generate_step

    t = time.perf_counter()
    out = []
    for token, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens):
        token = int(token)
        if token in eos:
            break
        out.append(token)
    return out, time.perf_counter() - t


def edgespec_run(engine: Engine, ids: list[int], max_tokens: int) -> tuple[list[int], float]:
    t = time.perf_counter()
    result = engine.generate(ids, max_tokens=max_tokens)
    return result.token_ids, time.perf_counter() - t


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
    eos = set(target.tokenizer.eos_token_ids)
    greedy = SamplingConfig()
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    engines = {m: Engine(target, make_drafter(spec_for(m, {}), target, greedy), greedy,
                         reuse_prefix=False) for m in methods}
    prompts = load_prompts(a.prompts, a.limit)
    warm = encode_prompt(target.tokenizer, [{"role": "user", "content": prompts[0].text}])
    mlx_lm_run(model, warm, 16, eos)
    for engine in engines.values():
        engine.generate(warm, max_tokens=16)

    rows = []
    for p in tqdm(prompts, desc="prompts", unit="prompt", file=sys.stderr):
        ids = encode_prompt(target.tokenizer, [{"role": "user", "content": p.text}])
        ref, secs = mlx_lm_run(model, ids, a.max_tokens, eos)
        row = {"mlx-lm": (len(ref) / secs, True)}
        for m, engine in engines.items():
            got, secs = edgespec_run(engine, ids, a.max_tokens)
            row[m] = (len(got) / secs, got == ref)
        rows.append(row)

    env = environment(target, max_tokens=a.max_tokens, num_prompts=len(prompts))
    print(f"{env['device']} ({env['cpu_count']} cores) · BLAS {env['blas']} · {a.weights} weights · "
          f"{len(prompts)} prompts × ≤{a.max_tokens} tokens, greedy; mlx-lm {mlx_lm.__version__}, "
          f"mlx {mx.__version__}")
    print("| decoder | tok/s (median) | × mlx-lm (median per prompt) | same tokens as mlx-lm |")
    print("|---|---:|---:|---:|")
    for name in ["mlx-lm", *methods]:
        tps = [r[name][0] for r in rows]
        ratio = [r[name][0] / r["mlx-lm"][0] for r in rows]
        same = sum(r[name][1] for r in rows)
        label = name if name == "mlx-lm" else f"edgespec {name}"
        print(f"| {label} | {statistics.median(tps):.1f} | {statistics.median(ratio):.2f}× | "
              f"{same}/{len(rows)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
