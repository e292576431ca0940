"""A GGUF's layout converted, loaded kept quantized and run: what the converter and the loader
make of a real file's shapes and types, and what a forward of them costs.

Usage: python scripts/layout_check.py GGUF OUT — converts GGUF into the model folder OUT (once),
loads it with ``--dtype auto`` and prints the conversion and load times, whether every block
runs natively, what was re-packed and rounded, the process's peak memory, and the best of 3
forwards of 1 and of 8 tokens after 16 of context. A file whose tensor data is partly missing
(the first parts of a split GGUF, extended to its size as a sparse file: the missing weights
read as zeros) still gives the real layout's shapes, types and costs; its output means nothing.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)

import mlx.core as mx

from edgespec.loading import gguf as eg
from edgespec.targets import load_target


def main(gguf: str, out_dir: str) -> None:
    t0 = time.time()
    out = Path(out_dir)
    if not out.exists():
        eg.convert_gguf(gguf, out, progress=False)
    print(f"converted in {time.time() - t0:.0f} s", flush=True)
    cfg = json.loads((out / "config.json").read_text())
    quant = {k: v for k, v in (cfg.get("quantization") or {}).items() if not isinstance(v, dict)}
    print(f"quantization {quant}, decoded dense {len(cfg.get('gguf_decoded_dense', {}))}")
    t0 = time.time()
    t = load_target(out, dtype="auto")
    rounded = {k: len(v) for k, v in t.model.rounded.items()}
    print(f"loaded in {time.time() - t0:.0f} s; native blocks {t.model.native_blocks()}; "
          f"re-packed {t.model.widened}; rounded {rounded}", flush=True)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.1f} GB")
    for n in (1, 8):
        cache = t.make_cache()
        mx.eval(t.score(list(range(100, 116)), cache).logits)
        cache.commit()
        times = []
        for _ in range(3):
            t1 = time.perf_counter()
            mx.eval(t.score(list(range(200, 200 + n)), cache).logits)
            times.append(time.perf_counter() - t1)
        print(f"forward of {n} tokens: {min(times) * 1e3:.0f} ms", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
