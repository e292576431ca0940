"""``edgespec doctor``: is this machine set up for speculation to pay?

Reports the backend and device, the BLAS that serves float32 matmuls, which native CPU kernels
are active (or why none are: not built, stale, turned off, not on the CPU), which Metal kernels
are active (or why not: no Metal device, turned off; emulated when asked), and two measurements on a
model: the cost of a target forward over 1, 2, 4, 8 and 16 tokens after a 128-token context
(speculation lives in the regime where 8 tokens cost little more than 1) and the speed of plain
decoding. Medians of repeated runs.
"""

from __future__ import annotations

import platform
import statistics
import time

import mlx.core as mx

from . import BLAS, __version__
from .kernels.backend import metal_summary, native_summary
from .loading._blas import blas_info
from .engine import Engine
from .stats import phrase
from .targets import load

_CONTEXT, _REPEATS = 128, 9


def forward_times(target, sizes=(1, 2, 4, 8, 16), context: int = _CONTEXT) -> dict[int, float]:
    """Median seconds of one forward over n new tokens after ``context`` cached tokens."""
    cache = target.make_cache()
    ids = [(7 * i) % 1000 + 10 for i in range(context + max(sizes))]
    target.score(ids[:context], cache, head=False)
    cache.commit()
    mx.eval(cache.state())
    times = {}
    for n in sizes:
        runs = []
        for _ in range(_REPEATS):
            t = time.perf_counter()  # the mask is built inside: the engine pays for it too
            out = target.score(ids[context : context + n], cache)
            mx.eval(out.logits)
            runs.append(time.perf_counter() - t)
        times[n] = statistics.median(runs[1:])
    return times


def run_doctor(model_ref: str = "demo", dtype: str | None = None) -> dict:
    info = blas_info()
    target = load(model_ref, dtype=dtype)
    times = forward_times(target)
    eng = Engine(target)
    eng.generate([{"role": "user", "content": "Count from one to twenty in words."}], max_tokens=8)
    res = eng.generate([{"role": "user", "content": "Write a short poem about the sea."}], max_tokens=64)
    return {
        "edgespec": __version__, "mlx": mx.__version__, "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "device": str(mx.default_device()), "gpu_available": bool(mx.is_available(mx.gpu)),
        "blas": {"name": info.name, "status": info.status, "path": info.path,
                 "provider": info.provider, "loaded_at_import": BLAS.name},
        "native_kernels": native_summary(),
        "metal_kernels": metal_summary(),
        "model": target.name, "dtype": target.dtype, "layers": target.num_layers,
        "forward_ms": {n: round(t * 1e3, 2) for n, t in times.items()},
        "forward_ratio_8_vs_1": round(times[8] / times[1], 2),
        "plain_decode_tok_s": round(res.stats.tokens_per_s, 2),
    }


def format_findings(f: dict) -> str:
    b = f["blas"]
    ok_blas = b["name"] not in ("reference",)
    ratio = f["forward_ratio_8_vs_1"]
    lines = [
        f"edgespec {f['edgespec']}  mlx {f['mlx']}  python {f['python']}  {f['platform']}",
        f"device     {f['device']} (GPU available: {f['gpu_available']})",
        f"BLAS       {b['name']} [{b['status']}] {b['provider'] or ''}"
        + ("" if ok_blas else "  <- reference BLAS: install OpenBLAS or MKL (scripts/setup.sh)"),
        f"kernels    {f['native_kernels']}",
        f"metal      {f['metal_kernels']}",
        f"model      {f['model']}  dtype {f['dtype']}  layers {f['layers']}",
        "forward    " + "  ".join(f"{n} tok {ms:.1f} ms" for n, ms in f["forward_ms"].items()),
        f"           8-token / 1-token = {ratio:.2f}x"
        + ("  (speculation-friendly)" if ratio <= 2.0 else "  (verifying drafts is expensive here)"),
        "plain decoding  " + phrase("tokens_per_s", f["plain_decode_tok_s"]),
    ]
    return "\n".join(lines)
