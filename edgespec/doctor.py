"""``edgespec doctor``: is this machine set up for speculation to pay?

Reports the backend and device, the BLAS that serves float32 matmuls, which native CPU kernels
are active (or why none are: not built, stale, turned off, not on the CPU), which Metal kernels
are active (or why not: no Metal device, turned off; emulated when asked), and two measurements on a
model: the cost of a target forward over 1, 2, 4, 8 and 16 tokens after a 128-token context
(speculation lives in the regime where 8 tokens cost little more than 1) and the speed of plain
decoding. Medians of repeated runs.

The bandwidth limit: every decoded token streams the weights a forward reads once (the blocks
and the LM head; an untied embedding table is only indexed), so plain decoding can go no faster
than (memory-streaming bandwidth) / (those bytes). The bandwidth is measured in the same run, by
summing a 256 MiB float32 array that no cache holds, one slice per core in parallel (on huge
pages, as the weights are); the share of that limit plain decoding reaches says how much a
faster kernel could still win. Decoding and the read take turns over a few rounds, and the
share is the ratio of their medians, with each round's own share beside it.

The compute floor: a forward over n tokens does n multiply-adds per weight it streams, so its
products take at least n x (those weights) / (the multiply-adds per second the cores sustain in
an FMA loop, measured by the native module's ``fma_peak``; for a kept-quantized model whose
products round x to int8, a loop of ``vpdpbusd``, ``q8_peak``); a verify of n tokens can cost
about what one costs only while that floor stays under the bandwidth floor of one token. The
FMA loop on one thread alone, taking turns with all of them, says whether the cores really are
separate at the moment: on small shared VMs the host sometimes runs two of them on one physical
core (two loops side by side then get half a core each), which doubles the cost of many-row
products.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from . import BLAS, __version__
from .kernels import native
from .kernels.backend import (metal_summary, native_summary, q8_form_runs, q8_scope,
                              use_native_block)
from .kernels.fused_block import STREAMED
from .kernels.matmul import halves, small_matmul, symmetric
from .kernels.qmatmul import half_scales, quantized_small_matmul, symmetric_biases
from .loading._blas import blas_info
from .engine import Engine
from .stats import phrase
from .targets import load
from .targets.cost import primed_cache
from .targets.experts import expert_shares
from .targets.weight_arena import huge_pages_wanted

_CONTEXT, _ROUNDS = 128, 15
_DECODE_ROUNDS = 5  # plain decoding and the bandwidth read, taking turns
# An 8-token forward at most this many times a 1-token one: verifying a draft tree costs about
# what a plain step costs, so every accepted draft token is nearly free. Past it only long
# accepted runs pay, and past _COSTLY_RATIO verifying drafts rarely pays at all.
FRIENDLY_RATIO, _COSTLY_RATIO = 1.4, 2.0


def forward_times(target, sizes=(1, 2, 4, 8, 16), context: int = _CONTEXT,
                  rounds: int = _ROUNDS) -> dict[int, float]:
    """Median seconds of one forward over n new tokens after ``context`` cached tokens.

    The sizes take turns, round by round, after one warm-up round that is not counted: on a
    shared machine drift then lands on every size alike, where timing one size after another
    let a slow spell move the 8/1 ratio far more than any code change did (same code, same
    machine)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    cache, ids = primed_cache(target, context, max(sizes))  # ids the model has
    runs: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(rounds + 1):
        for n in sizes:
            t = time.perf_counter()  # the mask is built inside: the engine pays for it too
            out = target.score(ids[context : context + n], cache)
            mx.eval(out.logits)
            if r > 0:
                runs[n].append(time.perf_counter() - t)
    return {n: statistics.median(ts) for n, ts in runs.items()}


def stream_bandwidth(mib: int = 256, repeats: int = 7) -> float:
    """Bytes per second that all cores together read from memory (median of ``repeats``).
    On Linux numpy asks for huge pages for an array this large (as ``Decoder.fuse`` does for
    the weights, ``targets/weight_arena``), which it gets unless the policy is 'never'."""
    data = np.ones(mib * 2**20 // 4, dtype=np.float32)
    parts = np.array_split(data, os.cpu_count() or 1)
    with ThreadPoolExecutor(len(parts)) as pool:  # numpy's sum releases the GIL
        runs = []
        for _ in range(repeats):
            t = time.perf_counter()
            list(pool.map(np.sum, parts))
            runs.append(time.perf_counter() - t)
    return data.nbytes / statistics.median(runs)


def decode_and_bandwidth(engine, rounds: int = _DECODE_ROUNDS) -> tuple[list[float], list[float]]:
    """Plain decoding's tokens/s (64 tokens of a short poem) and ``stream_bandwidth``, taking
    turns for ``rounds`` rounds after a warm-up: the share of the bandwidth limit compares the
    two, and on a shared VM both drift by several percent within a minute, so that single
    measurements of the share scatter."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    engine.generate([{"role": "user", "content": "Count from one to twenty in words."}], max_tokens=8)
    poem = [{"role": "user", "content": "Write a short poem about the sea."}]
    decode, bandwidths = [], []
    for _ in range(rounds):
        decode.append(engine.generate(poem, max_tokens=64).stats.tokens_per_s)
        bandwidths.append(stream_bandwidth())
    return decode, bandwidths


def streamed_bytes(target) -> int:
    """Bytes of the weights one decoding step reads: all but an untied embedding table, of
    a mixture of experts' stacked experts the share one token's router picks (k of E), less
    what the native products do not read (``_unread_bytes``)."""
    untied = not target.model.args.tie_word_embeddings
    shares = expert_shares(target.model)
    return round(sum(v.nbytes * (_expert_share(k, shares) or 1.0)
                     for k, v in tree_flatten(target.model.parameters())
                     if not (untied and k.startswith("model.embed_tokens.")))) - _unread_bytes(
                         target)


def _unread_bytes(target) -> int:
    """The bytes of the parameters a step does not read: of the float32 scales and biases
    whose float16 copies the native products read instead (``qmatmul.half_scales``: the fused
    blocks' ``halves`` and the LM head's), as many as the copies hold; and a symmetric
    format's biases (GGUF's Q8_0) where the AVX-512 VNNI int8 form makes them from the scales,
    what it would have read of them."""
    model = target.model
    mod = native.load()
    vnni = mod is not None and mod.q8_vnni()
    unread = 0
    for block in model.model.layers:
        fused = getattr(block, "_fused", None)
        if fused is None:
            continue
        unread += sum(a.nbytes for _, scales, biases in fused.halves.values()
                      for a in (scales, biases))
        if fused.native_args is not None and vnni:
            for (_, bits, sym), name in zip(fused.native_shape[-1], STREAMED):
                if sym and q8_form_runs(bits):
                    unread += fused.read(name)[2].nbytes
    head = model.output_head()
    if type(head) in (nn.QuantizedEmbedding, nn.QuantizedLinear):
        made = halves(head)
        unread += sum(a.nbytes for a in made or ())
        if vnni and q8_form_runs(head.bits) and symmetric(head):
            unread += (made[1] if made else head["biases"]).nbytes
    return unread


def _expert_share(key: str, shares: dict[str, float]) -> float | None:
    """The read share of parameter ``key`` when it belongs to stacked experts, else None."""
    return next((s for prefix, s in shares.items() if key.startswith(prefix)), None)


def multiply_adds_per_token(target) -> int:
    """Multiply-adds one token's forward does in the weights it streams (``streamed_bytes``'s
    arrays, counted in weights: a packed quantized array holds 32 / bits per uint32; stacked
    experts (E, out, in) at the share one token's router picks)."""
    untied = not target.model.args.tie_word_embeddings
    shares = expert_shares(target.model)
    bits = {}
    for name, module in target.model.named_modules():
        if hasattr(module, "bits") and hasattr(module, "group_size"):
            bits[f"{name}.weight" if name else "weight"] = module.bits
    total = 0
    for k, v in tree_flatten(target.model.parameters()):
        share = _expert_share(k, shares)
        untied_table = untied and k.startswith("model.embed_tokens.")
        if untied_table or v.ndim != (2 if share is None else 3):
            continue
        if k in bits:
            total += v.size * 32 // bits[k] * (share or 1.0)
        elif k.endswith("weight"):
            total += v.size * (share or 1.0)
    return round(total)


_FMA_ROUNDS = 5


def fma_rates() -> tuple[float, float, float, int] | None:
    """Multiply-adds per second of the FMA loop on all the native kernels' threads together and
    on one alone (the best of ``_FMA_ROUNDS`` rounds each, taking turns), the median of the
    rounds' all/one ratios, and how many threads that is; None without the native module. A
    ratio near 1 with two threads says their cores share FMA units at the moment (an SMT pair,
    or a host that runs both virtual cores on one physical one): products of many rows then
    cost up to twice as much."""
    from .kernels import native  # noqa: PLC0415

    mod = native.load()
    if mod is None:
        return None
    both, one = [], []
    for _ in range(_FMA_ROUNDS):
        both.append(mod.fma_peak(1))
        one.append(mod.fma_peak(1, all_threads=False))
    return (max(both), max(one), statistics.median(b / o for b, o in zip(both, one)),
            mod.threads())


def int8_rate(target) -> float | None:
    """Int8 multiply-adds per second of the vpdpbusd loop on all the kernels' threads (the best
    of ``_FMA_ROUNDS`` rounds) when ``target``'s products take int8 activations (kept quantized,
    every block native, the AVX-512 VNNI form); None otherwise: the FMA loop is then their
    ceiling."""
    from .kernels import native  # noqa: PLC0415
    from .kernels.backend import use_q8_activations  # noqa: PLC0415

    mod = native.load()
    if (mod is None or not target.quantized or not target.model.native_blocks()
            or not use_q8_activations(4)):
        return None
    rate = max(mod.q8_peak(1) for _ in range(_FMA_ROUNDS))
    return rate or None


_KERNEL_ROWS = (1, 8, 16)
_KERNEL_BYTES = 8 << 20  # the joined product's weights: a few MB, which the caches hold
_KERNEL_CHAIN = 8  # products evaluated together, so one evaluation's overhead is shared


def kernel_floor(target, multiply_adds: int, rounds: int = _FMA_ROUNDS) -> dict[int, float] | None:
    """What the products of a forward over n tokens cost at least as the kernels run them, with
    memory out of the way: the first blocks' linear layers that read the hidden state, joined
    into one product of at most ``_KERNEL_BYTES`` (at least one layer), which stays in the
    caches, and run the way a forward runs them (``kernels.matmul`` / ``qmatmul``, int8 x where
    the forward rounds it), ``_KERNEL_CHAIN`` products of n rows in one evaluation, the best of
    ``rounds`` rounds taking turns over n, scaled to ``multiply_adds`` (a token's:
    ``multiply_adds_per_token``); ms by n (``_KERNEL_ROWS``). Beside the FMA and vpdpbusd
    loops' floors it counts what they leave out: unpacking the weights, rounding x, the float
    work per block, splitting over threads (and MLX's dispatch of each product). None without
    native blocks or where the layers differ in format."""
    model = target.model
    if native.load() is None or not model.native_blocks():
        return None
    width = model.args.hidden_size
    mods = [m for layer in model.model.layers for _, m in layer.named_modules()
            if type(m) in (nn.Linear, nn.QuantizedLinear) and "bias" not in m]
    quantized = [m for m in mods if type(m) is nn.QuantizedLinear]

    def within_budget(ms: list) -> list:
        kept, total = [], 0
        for m in ms:
            total += sum(a.nbytes for _, a in tree_flatten(m.parameters()))
            if kept and total > _KERNEL_BYTES:
                break
            kept.append(m)
        return kept

    if quantized:
        first = quantized[0]
        mods = within_budget([m for m in quantized if m.bits == first.bits and m.mode == "affine"
                              and m.group_size == first.group_size
                              and m["weight"].shape[-1] * 32 // m.bits == width])
        if not mods:
            return None
        wq, scales, biases = (mx.concatenate([m[n] for m in mods]) for n in ("weight", "scales",
                                                                            "biases"))
        sym = symmetric_biases(scales, biases, first.bits)
        halves = half_scales(scales, biases)
        weights = wq.size * 32 // first.bits

        def product(x):
            return quantized_small_matmul(x, wq, scales, biases, first.group_size, first.bits,
                                          sym, halves)
    else:
        mods = within_budget([m for m in mods if m["weight"].dtype == mx.float32
                              and m["weight"].shape[-1] == width])
        if not mods:
            return None
        w = mx.concatenate([m["weight"] for m in mods])
        weights = w.size

        def product(x):
            return small_matmul(x, w)
    scale = multiply_adds / weights
    xs = {n: [mx.random.normal((1, n, width), key=mx.random.key(i)) for i in range(_KERNEL_CHAIN)]
          for n in _KERNEL_ROWS}
    mx.eval(xs)
    best = {n: float("inf") for n in _KERNEL_ROWS}
    with q8_scope(True):
        for r in range(rounds + 1):  # the first round warms up
            for n in _KERNEL_ROWS:
                t = time.perf_counter()
                mx.eval([product(x) for x in xs[n]])
                if r:
                    best[n] = min(best[n], (time.perf_counter() - t) / _KERNEL_CHAIN)
    return {n: round(t * scale * 1e3, 2) for n, t in best.items()}


def curve_verdict(ratio: float) -> str:
    """What an 8-token / 1-token forward ratio says about speculation on this machine."""
    if ratio <= FRIENDLY_RATIO:
        return "speculation-friendly"
    if ratio <= _COSTLY_RATIO:
        return f"above {FRIENDLY_RATIO}x: only long accepted runs pay"
    return "verifying drafts is expensive here"


def other_curve(model_ref: str, target) -> dict | None:
    """The forward curve of the model's other form: the float32 one beside a kept-quantized
    target, the kept-quantized one beside a float target whose checkpoint is quantized; None
    when the checkpoint has only one form."""
    other = load(model_ref, dtype="float32" if target.quantized else "auto", progress=False)
    if other.quantized == target.quantized:
        return None
    times = forward_times(other)
    return {"dtype": other.dtype, "quantized": other.quantized,
            "forward_ms": {n: round(t * 1e3, 2) for n, t in times.items()}}


def run_doctor(model_ref: str = "demo", dtype: str | None = None, both_curves: bool = True) -> dict:
    """Every finding as a dict. ``both_curves``: also time the forward curve of the model's other
    form (float beside quantized), so the two can be read side by side."""
    info = blas_info()
    target = load(model_ref, dtype=dtype)
    times = forward_times(target)
    other = other_curve(model_ref, target) if both_curves else None
    decode, bandwidths = decode_and_bandwidth(Engine(target))
    bandwidth, weight_bytes = statistics.median(bandwidths), streamed_bytes(target)
    shares = [t * weight_bytes / b for t, b in zip(decode, bandwidths)]
    macs = multiply_adds_per_token(target)
    rates, int8, floor = fma_rates(), int8_rate(target), kernel_floor(target, macs)
    return {
        "edgespec": __version__, "mlx": mx.__version__, "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "device": str(mx.default_device()), "gpu_available": bool(mx.is_available(mx.gpu)),
        "blas": {"name": info.name, "status": info.status, "path": info.path,
                 "provider": info.provider, "loaded_at_import": BLAS.name},
        "native_kernels": native_summary(),
        "metal_kernels": metal_summary(),
        "model": target.name, "dtype": target.dtype, "layers": target.num_layers,
        "widened": [{"bits": b, "to": t, "layers": n}
                    for (b, t), n in sorted(target.model.widened.items())],
        "rounded": {kind: len(mods) for kind, mods in sorted(target.model.rounded.items())},
        "native_blocks": target.model.native_block_count() if use_native_block() else 0,
        "forward_ms": {n: round(t * 1e3, 2) for n, t in times.items()},
        "forward_ratio_8_vs_1": round(times[8] / times[1], 2),
        "quantized": target.quantized,
        "other_curve": other,
        "plain_decode_tok_s": round(statistics.median(decode), 2),
        "bandwidth_gb_s": round(bandwidth / 1e9, 2),
        "streamed_weights_mb": round(weight_bytes / 2**20, 1),
        "bandwidth_limit_tok_s": round(bandwidth / weight_bytes, 2),
        "huge_page_mb": (round(target.model.huge_page_bytes / 2**20, 1)
                         if huge_pages_wanted() else None),
        "bandwidth_share_rounds": [round(x, 3) for x in shares],
        "fma_g_per_s": None if rates is None else round(rates[0] / 1e9, 1),
        "fma_one_thread_g_per_s": None if rates is None else round(rates[1] / 1e9, 1),
        "fma_threads_ratio": None if rates is None else round(rates[2], 2),
        "kernel_threads": None if rates is None else rates[3],
        "int8_g_per_s": None if int8 is None else round(int8 / 1e9, 1),
        "kernel_floor_ms": floor,
        "multiply_adds_per_token_m": round(macs / 1e6, 1),
        "expert_read_share": _expert_read(target),
    }


def _expert_read(target) -> dict[int, float] | None:
    """Of a mixture of experts' expert weights, the share a forward over n tokens reads (uniform
    routing), for the forward sizes measured; None for a dense model."""
    if not expert_shares(target.model):
        return None
    return {n: round(statistics.mean(expert_shares(target.model, n).values()), 3)
            for n in (1, 2, 4, 8, 16)}


def _other_curve_lines(other: dict | None) -> list[str]:
    if not other:
        return []
    fwd = other["forward_ms"]
    form = "kept quantized" if other["quantized"] else other["dtype"]
    ratio = fwd[8] / fwd[1]
    return [f"  {form:<9}" + "  ".join(f"{n} tok {ms:.1f} ms" for n, ms in fwd.items()),
            f"           8-token / 1-token = {ratio:.2f}x, 16-token / 1-token = "
            f"{fwd[16] / fwd[1]:.2f}x  ({curve_verdict(ratio)}; the same model {form}, "
            f"--dtype {'auto' if other['quantized'] else other['dtype']})"]


def format_findings(f: dict) -> str:
    b = f["blas"]
    ok_blas = b["name"] not in ("reference",)
    ratio = f["forward_ratio_8_vs_1"]
    fwd = f["forward_ms"]
    lines = [
        f"edgespec {f['edgespec']}  mlx {f['mlx']}  python {f['python']}  {f['platform']}",
        f"device     {f['device']} (GPU available: {f['gpu_available']})",
        f"BLAS       {b['name']} [{b['status']}] {b['provider'] or ''}"
        + ("" if ok_blas else "  <- reference BLAS: install OpenBLAS or MKL (scripts/setup.sh)"),
        f"kernels    {f['native_kernels']}",
        f"metal      {f['metal_kernels']}",
        f"model      {f['model']}  dtype {f['dtype']}  layers {f['layers']}"
        + ("" if f.get("native_blocks") is None else
           f"  ({f['native_blocks']} as the native block"
           + ("" if f["native_blocks"] == f["layers"] else
              "; the others take the module path, and products keep float x") + ")")
        + "".join(f"\n           {w['layers']} layers of {w['bits']}-bit weights re-packed as "
                  f"{w['to']}-bit for the native products (the same weights, more bytes)"
                  for w in f.get("widened", []))
        + "".join(f"\n           {n} {kind} layers rounded to 8 bits, groups of 32 (within half "
                  f"a step of the file's values; EDGESPEC_Q6K=float keeps them float32)"
                  for kind, n in f.get("rounded", {}).items()),
        "forward    " + "  ".join(f"{n} tok {ms:.1f} ms" for n, ms in f["forward_ms"].items()),
        f"           8-token / 1-token = {ratio:.2f}x"
        + ("" if not {1, 16} <= set(fwd) else f", 16-token / 1-token = {fwd[16] / fwd[1]:.2f}x")
        + f"  ({curve_verdict(ratio)})",
        *_other_curve_lines(f.get("other_curve")),
        "plain decoding  " + phrase("tokens_per_s", f["plain_decode_tok_s"]),
        f"bandwidth  {f['bandwidth_gb_s']:.1f} GB/s read (all cores) / {f['streamed_weights_mb']:.0f} MB "
        f"of weights per token = {f['bandwidth_limit_tok_s']:.1f} tok/s limit; plain decoding "
        f"reaches {100 * f['plain_decode_tok_s'] / f['bandwidth_limit_tok_s']:.0f}% of it "
        f"(medians of {len(f['bandwidth_share_rounds'])} rounds taking turns; each round "
        f"{100 * min(f['bandwidth_share_rounds']):.0f}-{100 * max(f['bandwidth_share_rounds']):.0f}%)",
    ]
    if f.get("expert_read_share"):
        lines.append("experts    a forward over " + ", ".join(
            f"{n} tok reads {100 * s:.0f}%" for n, s in f["expert_read_share"].items())
            + " of the expert weights (uniform routing): a forward's cost grows with the "
            "experts its rows pick; tree sizing measures this model's own verify-cost curve")
    if f["huge_page_mb"] is not None:
        lines.append(f"           {f['huge_page_mb']:.0f} of the {f['streamed_weights_mb']:.0f} MB on "
                     "huge pages, as the read's own array is (EDGESPEC_HUGE_PAGES=0 turns it off)")
    if f["fma_g_per_s"]:
        floor1 = 1e3 / f["bandwidth_limit_tok_s"]
        # the quantized products' ceiling is the int8 loop's where they take int8 x
        rate, loop = ((f["int8_g_per_s"], "int8 vpdpbusd loop: the products round x to int8")
                      if f.get("int8_g_per_s") else (f["fma_g_per_s"], "FMA loop"))
        per = f["multiply_adds_per_token_m"] * 1e6 / (rate * 1e9) * 1e3  # ms a token
        lines.append(
            f"compute    {rate:.0f} G multiply-adds/s ({loop}, all cores) x "
            f"{f['multiply_adds_per_token_m']:.0f} M a token: products of 8 tokens >= "
            f"{8 * per:.1f} ms, 16 >= {16 * per:.1f} ms; against 1 token's bandwidth floor "
            f"({floor1:.1f} ms): 8/1 >= {max(1.0, 8 * per / floor1):.2f}x, "
            f"16/1 >= {max(1.0, 16 * per / floor1):.2f}x")
        floor = f.get("kernel_floor_ms")
        if floor:
            products = ", ".join(f"{n} token{'s' if n > 1 else ''} >= {ms:.1f} ms"
                                 for n, ms in floor.items())
            lines.append(
                "           the kernels themselves, their weights in cache (the model's "
                f"hidden-width products joined into one, scaled to a token): products of {products}"
                + f"; 8/1 >= {max(1.0, floor[8] / floor1):.2f}x, 16/1 >= "
                f"{max(1.0, floor[16] / floor1):.2f}x against 1 token's bandwidth floor "
                "(unpacking, rounding x and the float work per block included)")
        threads, ratio = f["kernel_threads"], f["fma_threads_ratio"]
        shared = threads > 1 and ratio < 0.75 * threads
        lines.append(
            f"           FMA loop: one thread alone {f['fma_one_thread_g_per_s']:.0f} G; "
            f"{threads} threads together {ratio:.2f}x that (median of {_FMA_ROUNDS} rounds)"
            + (": their cores share FMA units now (an SMT pair, or a busy host), so forwards of "
               "many tokens cost up to 2x more than the floor above" if shared else ""))
    return "\n".join(lines)
