"""Plain decoding, edgespec against llama.cpp, in one process on the same GGUF.

    pip install llama-cpp-python        # builds llama.cpp from source (minutes)
    python scripts/vs_llama_cpp.py [--model demo] [--limit 8] [--max-tokens 128]
                                   [--methods none,lookup] [--dtypes auto,float32]

The Linux user's alternative is llama.cpp: this runs it (``llama_cpp.Llama`` on the GGUF file,
all cores, greedy) and edgespec on the same file's conversion, per prompt in turn, on the same
prompt token ids (the chat template applied once, by edgespec), stopping at EOS or
``--max-tokens``. Times include the prefill for both; llama.cpp's KV cache is reset before each
prompt, as edgespec's engines here start each prompt from scratch. ``--dtypes``: edgespec's
weights, ``auto`` keeping the GGUF's quantization (Q4_1 -> MLX 4-bit, group 32; the native
quantized kernel), ``float32`` dequantized. The prompts are MT-bench's (measuring only).
Run it on an otherwise idle machine; the table names the CPU.
"""

from __future__ import annotations

import argparse
import os
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
from edgespec.loading.hub import SHORTCUTS, resolve_model
from edgespec.options import spec_for
from edgespec.prompt import encode_prompt
from edgespec.targets import load_target

EVAL = Path(__file__).resolve().parents[1].parent / "shared" / "eval" / "mt_bench.jsonl"


def gguf_file(ref: str) -> Path:
    return SHORTCUTS[ref]() if ref in SHORTCUTS else Path(ref).expanduser()


def llama_run(llm, ids: list[int], max_tokens: int, eos: set[int]) -> tuple[list[int], float]:
    t = time.perf_counter()
    llm.reset()
    out = []
    for token in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        if token in eos or len(out) == max_tokens:
            break
        out.append(int(token))
    return out, time.perf_counter() - t


def edgespec_run(engine: Engine, ids: list[int], max_tokens: int) -> tuple[list[int], float]:
    t = time.perf_counter()
    tokens = engine.generate(ids, max_tokens=max_tokens).token_ids
    return tokens, time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo", help="'demo', 'gemma3-270m' or a .gguf file")
    ap.add_argument("--prompts", default=str(EVAL))
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--methods", default="none,lookup")
    ap.add_argument("--dtypes", default="auto,float32")
    a = ap.parse_args(argv)
    try:
        from llama_cpp import Llama, __version__ as llama_version
    except ImportError:
        print("needs llama-cpp-python: pip install llama-cpp-python", file=sys.stderr)
        return 2

    path = gguf_file(a.model)
    llm = Llama(model_path=str(path), n_ctx=4096, n_threads=os.cpu_count(), verbose=False)
    greedy = SamplingConfig()
    arms = {}
    for dtype in [d.strip() for d in a.dtypes.split(",") if d.strip()]:
        target = load_target(resolve_model(a.model), dtype=dtype)
        for m in [m.strip() for m in a.methods.split(",") if m.strip()]:
            arms[f"edgespec {m} ({target.dtype}{', 4/8-bit' if target.quantized else ''})"] = (
                Engine(target, make_drafter(spec_for(m, {}), target, greedy), greedy,
                       reuse_prefix=False))
    tokenizer = target.tokenizer
    eos = set(tokenizer.eos_token_ids)
    prompts = load_prompts(a.prompts, a.limit)
    warm = encode_prompt(tokenizer, [{"role": "user", "content": prompts[0].text}])
    llama_run(llm, warm, 16, eos)
    for engine in arms.values():
        engine.generate(warm, max_tokens=16)

    rows = []
    for p in tqdm(prompts, desc="prompts", unit="prompt", file=sys.stderr):
        ids = encode_prompt(tokenizer, [{"role": "user", "content": p.text}])
        ref, secs = llama_run(llm, ids, a.max_tokens, eos)
        row = {"llama.cpp": (len(ref) / secs, True)}
        for name, engine in arms.items():
            got, secs = edgespec_run(engine, ids, a.max_tokens)
            row[name] = (len(got) / secs, got == ref)
        rows.append(row)

    env = environment(target, max_tokens=a.max_tokens, num_prompts=len(prompts))
    print(f"{env['device']} ({env['cpu_count']} cores) · BLAS {env['blas']} · {path.name} · "
          f"{len(prompts)} prompts × ≤{a.max_tokens} tokens, greedy; llama-cpp-python "
          f"{llama_version}, mlx {mx.__version__}")
    print("| decoder | tok/s (median) | × llama.cpp (median per prompt) | same tokens as llama.cpp |")
    print("|---|---:|---:|---:|")
    for name in rows[0]:
        tps = [r[name][0] for r in rows]
        ratio = [r[name][0] / r["llama.cpp"][0] for r in rows]
        same = sum(r[name][1] for r in rows)
        print(f"| {name} | {statistics.median(tps):.1f} | {statistics.median(ratio):.2f}× | "
              f"{same}/{len(rows)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
