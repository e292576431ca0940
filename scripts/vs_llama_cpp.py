"""Plain decoding, edgespec against llama.cpp, in one process on the same GGUF.

    pip install llama-cpp-python        # builds llama.cpp from source (minutes)
    python scripts/vs_llama_cpp.py [--model demo] [--limit 8] [--max-tokens 128]
                                   [--methods none,lookup] [--dtypes auto,float32]
                                   [--requantize q8_0]

The Linux user's alternative is llama.cpp: this runs it (``llama_cpp.Llama`` on the GGUF file,
all cores, greedy) and edgespec on the same file's conversion, per prompt in turn, on the same
prompt token ids (the chat template applied once, by edgespec), stopping at EOS or
``--max-tokens``. Times include the prefill for both; llama.cpp's KV cache is reset before each
prompt, as edgespec's engines here start each prompt from scratch. ``--dtypes``: edgespec's
weights, ``auto`` keeping the GGUF's quantization (Q4_1 -> MLX 4-bit, group 32; the native
quantized kernel), ``float32`` dequantized. ``--requantize q8_0`` first writes a copy of the
GGUF with every tensor in that llama.cpp type (llama.cpp's own quantizer, from the file's
weights as they are: the demo's Q4_1 values held in 8 bits) and compares on that copy: an 8-bit
model throughout, which edgespec keeps as MLX 8-bit (group 32). The prompts are MT-bench's
(measuring only).
Run it on an otherwise idle machine; the table names the CPU.

MKL runs single-threaded here (``MKL_NUM_THREADS=1`` unless set): with MKL's own OpenMP threads
in the process (once edgespec's float32 prefills had used MKL), llama.cpp's threads were
measured to decode several times slower, while edgespec's float32 decoding did not change (its
products of up to 32 rows are its own kernels); see docs/measurements.md, "MKL's OpenMP
threads". On a CPU that reports AMX (Intel Sapphire Rapids and later) in a VM,
llama-cpp-python 0.3.36's default build crashed in ``llama_decode``; building it without AMX
works:
``CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON"
pip install llama-cpp-python``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("MKL_NUM_THREADS", "1")  # before MKL loads (edgespec's import): see above
import edgespec  # noqa: E402,F401  (first: it loads the optimized BLAS before MLX starts)
import mlx.core as mx

from edgespec.bench import environment, load_prompts
from edgespec.loading.hub import SHORTCUTS, resolve_model
from edgespec.targets import load_target
from side_by_side import EVAL, compare, engine_run, greedy_engine, print_table


def gguf_file(ref: str) -> Path:
    return SHORTCUTS[ref]() if ref in SHORTCUTS else Path(ref).expanduser()


def requantized(path: Path, kind: str) -> Path:
    """A copy of ``path`` with its tensors in llama.cpp's type ``kind`` (e.g. q8_0), made once
    and kept beside the other temporary files."""
    import ctypes  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    import llama_cpp  # noqa: PLC0415

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind.upper()}", None)
    if ftype is None:
        known = sorted(n.removeprefix("LLAMA_FTYPE_MOSTLY_").lower() for n in dir(llama_cpp)
                       if n.startswith("LLAMA_FTYPE_MOSTLY_"))
        raise SystemExit(f"--requantize {kind!r}: not a llama.cpp type; one of {', '.join(known)}")
    out = Path(tempfile.gettempdir()) / "edgespec-gguf" / f"{path.stem}.{kind.upper()}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.nthread = ftype, True, os.cpu_count() or 1
        partial = out.with_suffix(".partial")
        if llama_cpp.llama_model_quantize(str(path).encode(), str(partial).encode(),
                                          ctypes.byref(params)) != 0:
            raise SystemExit(f"llama.cpp could not requantize {path} to {kind}")
        partial.rename(out)
    return out


def llama_runner(llm, eos: set[int]):
    def run(ids: list[int], max_tokens: int) -> tuple[list[int], float]:
        t = time.perf_counter()
        llm.reset()
        out = []
        for token in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0,
                                  reset=True):
            if token in eos or len(out) == max_tokens:
                break
            out.append(int(token))
        return out, time.perf_counter() - t
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo", help="'demo', 'gemma3-270m' or a .gguf file")
    ap.add_argument("--prompts", default=str(EVAL))
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--methods", default="none,lookup")
    ap.add_argument("--dtypes", default="auto,float32")
    ap.add_argument("--requantize", default=None, metavar="TYPE",
                    help="compare on a copy of the GGUF in this llama.cpp type (e.g. q8_0)")
    a = ap.parse_args(argv)
    try:
        from llama_cpp import Llama, __version__ as llama_version
    except ImportError:
        print("needs llama-cpp-python: pip install llama-cpp-python", file=sys.stderr)
        return 2

    path = gguf_file(a.model)
    if a.requantize:
        path = requantized(path, a.requantize)
        a.model = str(path)
    llm = Llama(model_path=str(path), n_ctx=4096, n_threads=os.cpu_count(), verbose=False)
    runs = {}
    for dtype in [d.strip() for d in a.dtypes.split(",") if d.strip()]:
        target = load_target(resolve_model(a.model), dtype=dtype)
        for m in [m.strip() for m in a.methods.split(",") if m.strip()]:
            label = f"edgespec {m} ({target.dtype}{', 4/8-bit' if target.quantized else ''})"
            runs[label] = engine_run(greedy_engine(target, m))
    runs = {"llama.cpp": llama_runner(llm, set(target.tokenizer.eos_token_ids)), **runs}
    prompts = load_prompts(a.prompts, a.limit)
    rows = compare("llama.cpp", runs, target.tokenizer, prompts, a.max_tokens)

    env = environment(target, max_tokens=a.max_tokens, num_prompts=len(prompts))
    print(f"{env['device']} ({env['cpu_count']} cores) · BLAS {env['blas']} · {path.name} · "
          f"{len(prompts)} prompts × ≤{a.max_tokens} tokens, greedy; llama-cpp-python "
          f"{llama_version}, mlx {mx.__version__}")
    print_table(rows, "llama.cpp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
