"""The quantized kernel's cost per row count: float x against int8 x, on every SIMD ISA here.

Usage: python scripts/qkernel_rows.py [--rounds R] [--rows 1,2,4,8,16,32] [--bits 4]
       [--group-size 32] [--shapes gate|up,down] [--copies 4] [--symmetric] [--json OUT]

For each product shape of the demo model (SmolLM2-135M: q|k|v, o, gate|up, down, the tied LM
head), each row count, each ISA the CPU has (``avx512``, ``avx2``; ``set_isa``) and each kind
of x (float, int8: ``quantized_small_matmul_native(..., q8)``), times the product over
``--copies`` distinct weight copies in one ``mx.eval`` (4: they stay in the last-level cache,
so this is the kernel's compute cost; 30: they stream from memory, as a forward reads them).
The configurations are interleaved round by round and the best round is kept (the machine may
be shared: the best is the least disturbed). Prints µs per product and the ratio to one row.
``--symmetric`` gives the weights biases of -2^(bits - 1) times their scales (GGUF's Q8_0) and
adds a column, ``int8 sym``: the int8 product told so (``symmetric=True``), which on AVX-512 VNNI
makes the biases from the scales instead of reading them (the same bits). ``--half`` rounds the
scales and biases to float16 numbers (as a GGUF's are) and adds a column, ``int8 f16``: the int8
product reading float16 copies of them (``qmatmul.half_scales``; the same bits; told symmetric
with ``--symmetric``).
``EDGESPEC_KERNEL_THREADS=1`` times one thread. ``--clock cpu`` times the process's CPU time
instead of the wall clock (on a machine shared with other jobs, time spent descheduled is not
counted; with more than one kernel thread it sums their time).
"""

from __future__ import annotations

import argparse
import json
import time

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
import mlx.core as mx

from edgespec.kernels import native
from edgespec.kernels.qmatmul import quantized_small_matmul_native

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate|up": (3072, 576), "down": (576, 1536),
          "head": (49152, 576)}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--rows", default="1,2,4,8,16,32")
    p.add_argument("--bits", type=int, default=4, choices=(4, 8))
    p.add_argument("--group-size", type=int, default=32, choices=(32, 64, 128))
    p.add_argument("--shapes", default="gate|up,down,qkv,o")
    p.add_argument("--copies", type=int, default=4)
    p.add_argument("--calls", type=int, default=10, help="evaluations per timing")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    p.add_argument("--symmetric", action="store_true",
                   help="biases of -2^(bits - 1) x scales, and an int8 column told so")
    p.add_argument("--half", action="store_true",
                   help="float16-number scales, and an int8 column reading float16 copies")
    p.add_argument("--json", help="write the table here too")
    return p.parse_args(argv)


def time_one(x, ws, g, b, q8, calls, clock=time.perf_counter, sym=False) -> float:
    mx.eval([quantized_small_matmul_native(x, *q, g, b, q8, sym) for q in ws])  # warm
    t = clock()
    for _ in range(calls):
        mx.eval([quantized_small_matmul_native(x, *q, g, b, q8, sym) for q in ws])
    return (clock() - t) / calls / len(ws) * 1e6


def main(argv=None) -> dict:
    a = parse(argv)
    mod = native.load()
    if mod is None:
        raise SystemExit(f"native kernels not loaded: {native.status().reason}")
    isas = [i for i in ("avx512", "avx2") if i in mod.supported_isas().split(",")]
    rows = [int(r) for r in a.rows.split(",")]
    shapes = a.shapes.split(",")
    mx.random.seed(0)
    ws = {s: [mx.quantize(mx.random.normal(SHAPES[s]), group_size=a.group_size, bits=a.bits)
              for _ in range(a.copies)] for s in shapes}
    if a.symmetric:
        ws = {s: [(wq, sc, sc * -float(2 ** (a.bits - 1))) for wq, sc, _ in w]
              for s, w in ws.items()}
    kinds = ("float", "int8", "int8 sym") if a.symmetric else ("float", "int8")
    wide = ws
    if a.half:
        ws = {s: [(wq, sc.astype(mx.float16), bi.astype(mx.float16)) for wq, sc, bi in w]
              for s, w in ws.items()}
        wide = {s: [(wq, sc.astype(mx.float32), bi.astype(mx.float32)) for wq, sc, bi in w]
                for s, w in ws.items()}
        kinds += ("int8 f16",)
    xs = {(s, m): mx.random.normal((m, SHAPES[s][1])) for s in shapes for m in rows}
    mx.eval(ws, wide, xs)
    configs = [(s, isa, kind, m) for s in shapes for isa in isas for kind in kinds for m in rows]
    clock = time.process_time if a.clock == "cpu" else time.perf_counter
    best: dict = {}
    before = mod.isa()
    try:
        for _ in range(a.rounds):
            for s, isa, kind, m in configs:
                mod.set_isa(isa)
                try:
                    us = time_one(xs[s, m], (ws if kind == "int8 f16" else wide)[s],
                                  a.group_size, a.bits, kind != "float", a.calls, clock,
                                  kind == "int8 sym" or (kind == "int8 f16" and a.symmetric))
                except ValueError:  # no int8 form for this ISA in this build
                    us = float("nan")
                key = (s, isa, kind, m)
                best[key] = min(best.get(key, us), us)
    finally:
        mod.set_isa(before)
    print(f"native: {native.status().reason}; {a.bits}-bit, group {a.group_size}, "
          f"{a.copies} weight copies, best of {a.rounds} rounds x {a.calls} calls, {a.clock} "
          "clock; µs per product"
          " (x/1: against one row of the same column)")
    head = "".join(f" {isa + ' ' + kind:>18}" for isa in isas for kind in kinds)
    out = {}
    for s in shapes:
        print(f"\n{s} {SHAPES[s][0]}x{SHAPES[s][1]}\n{'rows':>5}{head}")
        for m in rows:
            cells = []
            for isa in isas:
                for kind in kinds:
                    us, one = best[s, isa, kind, m], best[s, isa, kind, rows[0]]
                    cells.append(f" {us:>9.0f} ({us / one:>4.2f}x)")
                    out[f"{s}/{isa}/{kind}/{m}"] = round(us, 1)
            print(f"{m:>5}" + "".join(cells))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bits": a.bits, "group_size": a.group_size, "copies": a.copies,
                       "native": native.status().reason, "us": out}, f, indent=1)
    return out


if __name__ == "__main__":
    main()
