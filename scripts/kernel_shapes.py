"""The native small_matmul against MLX's matmul (the BLAS), per product of the demo model.

Usage: python scripts/kernel_shapes.py [ROUNDS] [ROWS,ROWS,...] — for each product shape of the
demo model (SmolLM2-135M: q|k|v, o, gate|up, down, the tied LM head) and each row count,
times ``x @ w.T`` both ways. Each timing evaluates the product over 30 distinct weight copies
in one ``mx.eval`` (so the last-level cache cannot hold the weights and consecutive products
run back to back, as in a forward), and the two ways alternate within each round. Prints
medians (µs per product) and kernel / BLAS.
"""

from __future__ import annotations

import statistics
import sys
import time

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
import mlx.core as mx

from edgespec.kernels.matmul import small_matmul_mlx, small_matmul_native
from edgespec.kernels.native import status

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate|up": (3072, 576), "down": (576, 1536),
          "head": (49152, 576)}
COPIES = {"head": 2}  # 2 x 113 MB; the block shapes get 30 copies each


def per_product_us(fn, x, ws) -> float:
    t = time.perf_counter()
    mx.eval([fn(x, w) for w in ws])
    return (time.perf_counter() - t) / len(ws) * 1e6


def main(rounds: str = "5", rows: str = "1,2,4,8,16,32,64") -> None:
    ms = [int(r) for r in rows.split(",")]
    mx.random.seed(0)
    ws = {s: [mx.random.normal(shape) for _ in range(COPIES.get(s, 30))] for s, shape in SHAPES.items()}
    xs = {(s, m): mx.random.normal((m, shape[1])) for s, shape in SHAPES.items() for m in ms}
    mx.eval(ws, xs)
    ways = {"blas": small_matmul_mlx, "kernel": small_matmul_native}
    times = {}
    for r in range(int(rounds)):
        for s in SHAPES:
            for m in ms:
                for way in list(ways)[:: 1 if r % 2 == 0 else -1]:
                    times.setdefault((s, m, way), []).append(per_product_us(ways[way], xs[s, m], ws[s]))
    print(f"native: {status().reason}; medians of {rounds} rounds, µs per product")
    print(f"{'product':>8} {'rows':>4} {'blas':>9} {'kernel':>9} {'kernel/blas':>11}")
    for s in SHAPES:
        for m in ms:
            b, k = (statistics.median(times[s, m, w]) for w in ways)
            print(f"{s:>8} {m:>4} {b:>9.0f} {k:>9.0f} {k / b:>11.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
