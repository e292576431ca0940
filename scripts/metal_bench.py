"""What a Mac user runs to measure the Metal tree-verification kernels (issue 14).

    python scripts/metal_bench.py                      # kernels vs twins, then edgespec bench
    python scripts/metal_bench.py --ops-only           # kernels vs twins only
    python scripts/metal_bench.py --prompts p.jsonl --model demo --methods none,eagle3

1. Each op, kernel vs its pure-MLX twin, on the GPU: tree attention for tree sizes 1..64 and
   contexts 128..8192 (a model's head shape: ``--heads``, ``--kv-heads``, ``--head-dim``,
   ``--dtype``), greedy acceptance (the kernel reads back a few integers; the twin reads back
   the N argmax tokens and walks on the host) and KV compaction. Medians of ``--reps`` timed
   evaluations after a warm-up; one table per op.
2. ``edgespec bench`` twice over the same prompts, with ``EDGESPEC_METAL_KERNELS=auto``
   (kernels on) and ``=off`` (twins), each in its own process; the two reports' tok/s side
   by side.

It refuses to run without a Metal device: timings of the emulation (``EDGESPEC_METAL_KERNELS=
emulate``) say nothing about a GPU. ``--check`` runs every op once per shape through the
emulation on tiny sizes instead (no timings): a check that this script works, for CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import edgespec  # noqa: E402,F401  (loads the BLAS before mlx)
import mlx.core as mx  # noqa: E402

from edgespec.kernels.accept import accept_greedy  # noqa: E402
from edgespec.kernels.compact import gather_rows_kernel, gather_rows_twin  # noqa: E402
from edgespec.kernels.tree_attention import tree_attention_kernel, tree_attention_twin  # noqa: E402
from edgespec.kernels.tree_mask import tree_mask  # noqa: E402
from edgespec.tree import DraftTree  # noqa: E402
from edgespec.verify import verify_greedy  # noqa: E402

DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


def timed(fn, reps: int) -> float:
    """Median milliseconds of ``fn()`` evaluated, after one warm-up."""
    mx.eval(fn())
    runs = []
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        mx.eval(out)
        runs.append(time.perf_counter() - t)
    return statistics.median(runs) * 1e3


def random_tree(n: int, rng) -> DraftTree:
    parents = [-1] + [int(rng.integers(max(0, i - 4), i)) for i in range(1, n)]
    return DraftTree([int(t) for t in rng.integers(0, 1000, n)], parents)


def bench_ops(a, mode: str) -> None:
    rng = np.random.default_rng(0)
    dtype = DTYPES[a.dtype]
    timing = mode == "metal"
    print(f"tree attention, H {a.heads} / H_kv {a.kv_heads}, D {a.head_dim}, {a.dtype}: "
          "kernel ms / twin ms (the twin: dense mask built on the host + MLX attention)")
    print("  nodes " + "".join(f"{c:>16}" for c in a.contexts))
    for n in a.nodes:
        row = []
        tree = random_tree(n, rng)
        for ctx in a.contexts:
            q = mx.random.normal((1, a.heads, n, a.head_dim)).astype(dtype)
            k = mx.random.normal((1, a.kv_heads, ctx + n, a.head_dim)).astype(dtype)
            v = mx.random.normal((1, a.kv_heads, ctx + n, a.head_dim)).astype(dtype)
            scale = a.head_dim**-0.5

            def kernel():
                return tree_attention_kernel(q, k, v, scale, tree_mask(tree, n, 0, ctx, None),
                                             None, mode)

            def twin():
                return tree_attention_twin(q, k, v, scale, tree_mask(tree, n, 0, ctx, None))

            if timing:
                row.append(f"{timed(kernel, a.reps):7.3f}/{timed(twin, a.reps):<7.3f}")
            else:
                err = float(mx.abs(kernel().astype(mx.float32) - twin().astype(mx.float32)).max())
                row.append(f"err {err:.1e}")
        print(f"  {n:5d} " + "".join(f"{c:>16}" for c in row))

    print(f"greedy acceptance over V = {a.vocab}: kernel ms / host walk ms (argmax read back)")
    for n in a.nodes:
        tree = random_tree(n, rng)
        logits = mx.random.normal((n, a.vocab))
        if timing:
            def kernel():
                return mx.array(accept_greedy(tree.parents, tree.tokens,
                                              mx.argmax(logits, axis=-1), mode)[1])

            def twin():
                return mx.array(verify_greedy(tree, np.array(mx.argmax(logits, axis=-1))).tokens[-1])

            print(f"  {n:5d} {timed(kernel, a.reps):7.3f}/{timed(twin, a.reps):<7.3f}")
        else:
            argmax = mx.argmax(logits, axis=-1)
            want = verify_greedy(tree, np.array(argmax))
            got = accept_greedy(tree.parents, tree.tokens, argmax, mode)
            print(f"  {n:5d} {'same' if got == (want.path, want.tokens[-1]) else 'DIFFERENT'}")

    print(f"KV compaction of a 32-node path, {a.kv_heads} kv heads: kernel ms / twin ms")
    for ctx in a.contexts:
        keys = mx.random.normal((1, a.kv_heads, ctx + 64, a.head_dim)).astype(dtype)
        path = list(range(0, 64, 2))
        if timing:
            t1 = timed(lambda: gather_rows_kernel(keys, keys, ctx, path, mode), a.reps)
            t2 = timed(lambda: gather_rows_twin(keys, keys, ctx, path), a.reps)
            print(f"  ctx {ctx:5d} {t1:7.3f}/{t2:<7.3f}")
        else:
            same = mx.array_equal(gather_rows_kernel(keys, keys, ctx, path, mode)[0],
                                  gather_rows_twin(keys, keys, ctx, path)[0]).item()
            print(f"  ctx {ctx:5d} {'same' if same else 'DIFFERENT'}")


def bench_engine(a) -> None:
    """``edgespec bench`` with the kernels on and off, each in its own process."""
    tok_s = {}
    for mode in ("auto", "off"):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "report.json"
            cmd = [sys.executable, "-m", "edgespec.cli", "bench", "--prompts", a.prompts,
                   "--methods", a.methods, "--json", str(out), "--model", a.model]
            if a.limit:
                cmd += ["--limit", str(a.limit)]
            env = {**os.environ, "EDGESPEC_METAL_KERNELS": mode}
            print(f"$ EDGESPEC_METAL_KERNELS={mode} {' '.join(cmd[1:])}", flush=True)
            subprocess.run(cmd, env=env, check=True)
            report = json.loads(out.read_text())
            tok_s[mode] = {name: m["overall"] for name, m in report["methods"].items()}
    print("edgespec bench overall, kernels on (auto) vs off (twins):")
    for name in tok_s["auto"]:
        on, off = tok_s["auto"][name], tok_s["off"].get(name, {})
        print(f"  {name:12s} on {json.dumps(on)}\n  {'':12s} off {json.dumps(off)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true",
                   help="no Mac needed: run each op through the emulation on tiny sizes, no timings")
    p.add_argument("--ops-only", action="store_true", help="skip the edgespec bench comparison")
    p.add_argument("--nodes", default="1,2,4,8,16,32,64")
    p.add_argument("--contexts", default="128,512,2048,8192")
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--dtype", default="float16", choices=list(DTYPES))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--prompts", default=None, help="jsonl for edgespec bench")
    p.add_argument("--model", default="demo")
    p.add_argument("--methods", default="none,eagle3,lookup")
    p.add_argument("--limit", type=int, default=8)
    a = p.parse_args()
    a.nodes = [int(x) for x in a.nodes.split(",")]
    a.contexts = [int(x) for x in a.contexts.split(",")]
    if a.check:
        a.nodes, a.contexts, a.vocab = [1, 5, 64], [1, 40], 300
        bench_ops(a, "emulate")
        return 0
    if not mx.metal.is_available():
        print("metal_bench: no Metal device here. The kernels run on Apple silicon (macOS, MLX "
              "with Metal); on other machines only their emulation runs (tests), whose timings "
              "mean nothing. Use --check to run the ops through the emulation.", file=sys.stderr)
        return 2
    mx.set_default_device(mx.gpu)
    bench_ops(a, "metal")
    if not a.ops_only:
        if a.prompts is None:
            print("no --prompts: skipping the edgespec bench comparison", file=sys.stderr)
        else:
            bench_engine(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
