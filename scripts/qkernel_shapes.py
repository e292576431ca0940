"""The native quantized small-M kernel per product of the demo model kept 4-bit.

Usage: python scripts/qkernel_shapes.py [ROUNDS] [ROWS,ROWS,...] [BITS] [GROUP_SIZE] [Q8] — for each
product shape of SmolLM2-135M (q|k|v, o, gate|up, down, the tied LM head) and each row count,
times ``quantized_small_matmul_native`` (MLX's affine layout, float32 scales and biases, as the
demo's Q4_1 GGUF is kept). Each timing evaluates the product over 30 distinct weight copies (2 for
the head) in one ``mx.eval`` so the last-level cache cannot hold them. Prints medians (µs per
product) and packed-weight GB/s. ``Q8`` = 1: with int8 activations (``kernels/qmatmul.py``). For A/B runs of two builds, run it twice with
``EDGESPEC_NATIVE_DIR`` pointing at each build, alternating.
"""

from __future__ import annotations

import statistics
import sys
import time

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
import mlx.core as mx

from edgespec.kernels.native import status
from edgespec.kernels.qmatmul import quantized_small_matmul_native

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate|up": (3072, 576), "down": (576, 1536),
          "head": (49152, 576)}
COPIES = {"head": 2}


def main(rounds: str = "5", rows: str = "1,2,4,8,16", bits: str = "4", gs: str = "32",
         q8: str = "0") -> None:
    b, g, int8 = int(bits), int(gs), q8 == "1"
    ms = [int(r) for r in rows.split(",")]
    mx.random.seed(0)
    ws = {s: [mx.quantize(mx.random.normal(shape), group_size=g, bits=b)
              for _ in range(COPIES.get(s, 30))] for s, shape in SHAPES.items()}
    xs = {(s, m): mx.random.normal((m, shape[1])) for s, shape in SHAPES.items() for m in ms}
    mx.eval(ws, xs)
    times: dict = {}
    for _ in range(int(rounds)):
        for s in SHAPES:
            for m in ms:
                t = time.perf_counter()
                mx.eval([quantized_small_matmul_native(xs[s, m], *q, g, b, int8) for q in ws[s]])
                times.setdefault((s, m), []).append((time.perf_counter() - t) / len(ws[s]) * 1e6)
    print(f"native: {status().reason}; {b}-bit, group {g}, int8 x {int8}; medians of {rounds} rounds")
    print(f"{'product':>8} {'rows':>4} {'µs':>8} {'GB/s':>6}")
    for s, (n, k) in SHAPES.items():
        nbytes = n * k * b / 8 + 2 * 4 * n * k / g
        for m in ms:
            us = statistics.median(times[s, m])
            print(f"{s:>8} {m:>4} {us:>8.0f} {nbytes / us / 1e3:>6.1f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
