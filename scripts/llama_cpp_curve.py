"""The verify-cost curve of llama.cpp beside edgespec's, in one process, on the same GGUF.

    python scripts/llama_cpp_curve.py [--model demo] [--requantize q8_0] [--rounds 15]
                                      [--context 128] [--sizes 1,2,4,8,16]

What a forward over N new tokens costs after ``--context`` cached ones, against one token: the
ratio that decides whether speculation pays. llama.cpp (``llama_cpp.Llama`` on the GGUF, all
cores) decodes a batch of N tokens with every row's logits (as its own speculative decoding
verifies a draft), and its KV cache is cut back to the context after each; edgespec scores the
same N tokens as a chain (``Target.score`` with the LM head, the weights as ``--dtype auto``
keeps them) and its cache drops the uncommitted rows the same way. The sizes and the two
engines alternate round by round (a slow spell of a shared machine lands on all alike);
medians in ms. ``--requantize q8_0`` runs on the 8-bit copy ``vs_llama_cpp.py`` makes. Needs
``pip install llama-cpp-python``. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("MKL_NUM_THREADS", "1")  # as vs_llama_cpp.py (its docstring says why)

sys.path.insert(0, str(Path(__file__).resolve().parent))

import edgespec  # noqa: E402,F401  (loads the optimized BLAS before mlx)
import mlx.core as mx  # noqa: E402

from edgespec.loading.hub import resolve_model  # noqa: E402
from edgespec.targets import load_target  # noqa: E402
from edgespec.targets.cost import _cpu_name, primed_cache  # noqa: E402
from vs_llama_cpp import gguf_file, requantized  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo", help="'demo', 'gemma3-270m' or a .gguf file")
    ap.add_argument("--requantize", default=None, help="a llama.cpp type, e.g. q8_0")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--sizes", default="1,2,4,8,16")
    a = ap.parse_args(argv)
    try:
        from llama_cpp import Llama
    except ImportError:
        raise SystemExit("needs llama-cpp-python: pip install llama-cpp-python") from None
    sizes = [int(s) for s in a.sizes.split(",")]
    path = gguf_file(a.model)
    if a.requantize:
        path = requantized(path, a.requantize)
    llm = Llama(model_path=str(path), n_ctx=a.context + max(sizes) + 8, n_batch=512,
                n_threads=os.cpu_count(), logits_all=True, verbose=False)
    target = load_target(resolve_model(str(path)), dtype="auto")
    cache, ids = primed_cache(target, a.context, max(sizes))  # the same file: the same vocabulary
    context, more = ids[: a.context], ids[a.context :]
    llm.reset()
    llm.eval(context)

    def llama_forward(n: int) -> float:
        batch = llm._batch
        batch.set_batch(batch=more[:n], n_past=a.context, logits_all=True)
        t = time.perf_counter()
        llm._ctx.decode(batch)
        dt = time.perf_counter() - t
        llm._ctx.kv_cache_seq_rm(-1, a.context, -1)
        return dt

    def edgespec_forward(n: int) -> float:
        t = time.perf_counter()
        mx.eval(target.score(more[:n], cache).logits)
        return time.perf_counter() - t  # the rows stay uncommitted: the next score drops them

    runs = {"llama.cpp": llama_forward, "edgespec": edgespec_forward}
    times = {(e, n): [] for e in runs for n in sizes}
    for n in sizes:  # warm-up
        for fn in runs.values():
            fn(n)
    for r in range(a.rounds):
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for n in sizes:
            for e in order:
                times[(e, n)].append(runs[e](n) * 1e3)
    print(f"{path.name}, {a.context} tokens of context, {_cpu_name()}, {os.cpu_count()} threads, "
          f"median ms over {a.rounds} rounds")
    print(f"{'engine':>10} " + " ".join(f"{n:>7}" for n in sizes) + "   "
          + " ".join(f"{f'{n}/1':>6}" for n in sizes[1:]))
    for e in runs:
        med = [statistics.median(times[(e, n)]) for n in sizes]
        print(f"{e:>10} " + " ".join(f"{m:7.2f}" for m in med) + "   "
              + " ".join(f"{m / med[0]:6.2f}" for m in med[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
