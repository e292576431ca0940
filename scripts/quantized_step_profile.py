"""Where a verify forward's time goes on a quantized target, part by part, against float32.

Usage: python scripts/quantized_step_profile.py [MODEL] [ROUNDS] [DTYPES] [ROWS] — for each dtype
(comma-separated, as ``edgespec --dtype`` takes them; default ``auto,float32``: the demo's Q4_1
GGUF kept 4-bit, then dequantized) and each row count N (default 1,2,4,8,16), after a 128-token
context, times:

- ``tree`` / ``chain``: a whole target forward (``Target.score``, LM head included) over an
  N-node binary tree (as ``targets/cost.py`` measures the curve) and over an N-token chain;
- ``body``: the layers alone (tree, no LM head); ``head``: the final norm and LM head alone;
- per layer kind, the products of all layers with that weight (``qkv``, ``o``, ``gate|up``,
  ``down``) through the kernels a forward uses, one evaluation for all layers so the weights
  stream from memory as in a forward;
- ``attn-tree`` / ``attn-chain``: every layer's attention over the context plus N rows, under
  the tree's mask and a chain's (the native tree-attention kernel);
- ``norm+rope``: every layer's two RMSNorms and q|k|v RoPE split;
- LM head variants over N rows: as loaded (``head``), and the same weights as float32
  (``head-f32``) and 4- and 8-bit groups of 32 (``head-q4``, ``head-q8``; the 8-bit one from the
  float32 weights, for a float target).

``rest`` = body - the parts: what the one native block operation spends besides them (or, on
the module path, dispatch). All sizes and parts are interleaved round by round (a slow spell of
a shared machine lands on all alike); medians over ``ROUNDS`` (default 15). Run it on a quiet
machine; the engine-level step anatomy is ``scripts/spec_step_anatomy.py``.
"""

from __future__ import annotations

import statistics
import sys
import time

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
import mlx.core as mx
import numpy as np

from edgespec.kernels import native
from edgespec.kernels.backend import native_summary
from edgespec.kernels.matmul import small_matmul
from edgespec.kernels.qmatmul import quantized_small_matmul
from edgespec.kernels.rope_norm import qkv_rope, rms_norm
from edgespec.kernels.tree_attention import tree_attention
from edgespec.kernels.tree_mask import tree_mask
from edgespec.targets import load
from edgespec.targets.cost import primed_cache
from edgespec.tree import DraftTree

CONTEXT = 128
KINDS = {"qkv": ("wqkv", 0), "o": ("wo", 1), "gate|up": ("wgu", 2), "down": ("wd", 3)}


def timed(fn) -> float:
    t = time.perf_counter()
    mx.eval(fn())
    return (time.perf_counter() - t) * 1e3


def binary_tree(tokens: list[int]) -> DraftTree:
    return DraftTree(tokens, [-1] + [(i - 1) // 2 for i in range(1, len(tokens))])


def product(x, w, quant):
    """x @ w.T through the kernel a forward uses: float, or (packed, scales, biases)."""
    if quant is None:
        return small_matmul(x, w)
    gs, bits, *symmetric = quant
    return quantized_small_matmul(x, *w, gs, bits, bool(symmetric and symmetric[0]))


def head_variants(target) -> dict:
    """The LM head as loaded, and its weights as float32 / 8-bit / 4-bit (groups of 32)."""
    head = target.model.output_head()
    if "scales" in head:
        gs, bits = head.group_size, head.bits
        w = mx.dequantize(head.weight, head.scales, head.biases, group_size=gs, bits=bits)
    else:
        w = head.weight.astype(mx.float32)
    out = {"head-f32": (w, None)}
    for b in (8, 4):
        out[f"head-q{b}"] = (tuple(mx.quantize(w, group_size=32, bits=b)), (32, b))
    mx.eval([v[0] for v in out.values()])
    return out


def cases_for(target, n: int, cache, ids: list[int], heads: dict) -> dict:
    """name -> a function building the lazy result of that part for ``n`` rows."""
    args, blocks = target.args, target.model.model.layers
    fused = [b._fused for b in blocks]
    assert all(f is not None for f in fused), "the profile needs fused blocks (llama-like models)"
    quant = fused[0].native_shape[-1] if fused[0].native_args is not None else None
    quant = [tuple(q) for q in quant] if quant else None
    tree, chain = binary_tree(ids[:n]), DraftTree.chain(ids[0], ids[1:n])
    H, hq, hkv, d = args.hidden_size, *fused[0].native_shape[1:4]
    rng = np.random.default_rng(0)
    xs = {}
    cases = {"tree": lambda: target.score(tree, cache).logits,
             "chain": lambda: target.score(chain, cache).logits,
             "body": lambda: target.score(tree, cache, head=False).hidden}
    hidden = target.score(tree, cache, head=False).hidden
    mx.eval(hidden)
    cases["head"] = lambda: target.logits(hidden)
    for kind, (name, i) in KINDS.items():
        ws = [f.w[name] for f in fused]
        K = ws[0][0].shape[1] * 32 // quant[i][1] if quant else ws[0].shape[1]
        xs[kind] = mx.array(rng.standard_normal((1, n, K)).astype(np.float32))
        cases[kind] = (lambda ws=ws, x=xs[kind], q=quant[i] if quant else None:
                       [product(x, w, q) for w in ws])
    q = mx.array(rng.standard_normal((1, hq, n, d)).astype(np.float32))
    k, v = (mx.array(rng.standard_normal((1, hkv, CONTEXT + n, d)).astype(np.float32))
            for _ in range(2))
    scale = d**-0.5
    for label, shape in (("attn-tree", tree), ("attn-chain", None)):
        mask = tree_mask(shape, n, 0, CONTEXT, None)
        cases[label] = (lambda mask=mask: [tree_attention(q, k, v, scale, mask)
                                           for _ in blocks])
    x = mx.array(rng.standard_normal((1, n, H)).astype(np.float32))
    y = mx.array(rng.standard_normal((1, n, (hq + 2 * hkv) * d)).astype(np.float32))
    pos = mx.array(np.arange(CONTEXT, CONTEXT + n, dtype=np.int32))
    f0 = fused[0]
    rope_args = (f0.native_args[0], hq, hkv, d, *f0.native_shape[5:9], None, None)
    eps = f0.native_shape[9]

    def norm_rope():
        out = []
        for f in fused:
            out += [rms_norm(x, f.w["n1"], eps), rms_norm(x, f.w["n2"], eps)]
            out += list(qkv_rope(y, pos, *rope_args))
        return out

    cases["norm+rope"] = norm_rope
    hx = mx.array(rng.standard_normal((1, n, H)).astype(np.float32))
    for label, (w, qt) in heads.items():
        cases[label] = lambda w=w, qt=qt: product(hx, w, qt)
    mx.eval(list(xs.values()), q, k, v, x, y, pos, hx)
    return cases


def head_cases(target, cache, ids: list[int], sizes: list[int]) -> dict:
    """The EAGLE-3 head's draft forward (its layer and draft-vocabulary logits, as
    ``Eagle3Drafter`` runs a depth) over n rows after a 128-pair context, float32 and 8-/4-bit
    weights (``head_bits``), beside the target's one-row forward; {} without a head."""
    from edgespec.heads.find import find_head
    from edgespec.heads.loaded import head_in_bits, load_head_for

    if find_head(target, "eagle3") is None:
        return {}
    _, head = load_head_for(None, target, "eagle3")
    rng = np.random.default_rng(1)
    H = target.args.hidden_size
    one = DraftTree.chain(ids[0], [])
    cases = {("target", 1): lambda: target.score(one, cache).logits}
    for bits in (0, 8, 4):
        h = head_in_bits(target, head, bits)
        hc = h.make_cache()
        emb = target.model.embed(mx.array([(7 * i) % 1000 + 10 for i in range(CONTEXT)],
                                          dtype=mx.int32))
        feats = mx.array(rng.standard_normal((CONTEXT, H)).astype(np.float32))
        h.step(emb, feats, 0, tree_mask(None, CONTEXT, 0, 0, None) if CONTEXT <= 64 else None,
               hc)
        hc.commit()
        mx.eval(hc.state())
        for n in sizes:
            e = target.model.embed(mx.array(ids[:n], dtype=mx.int32))
            x = mx.array(rng.standard_normal((n, H)).astype(np.float32))
            mask = tree_mask(binary_tree(ids[:n]), n, 0, CONTEXT, None)
            mx.eval(e, x)
            cases[f"head{bits or 32}", n] = (lambda h=h, e=e, x=x, mask=mask, hc=hc:
                                             h.step(e, x, None, mask, hc))
    return cases


def profile(ref: str, dtype: str, rounds: int, sizes: list[int]) -> dict:
    target = load(ref, dtype=dtype, progress=False)
    cache, ids = primed_cache(target, CONTEXT, max(sizes))
    heads = head_variants(target)
    cases = {(n, p): fn for n in sizes
             for p, fn in cases_for(target, n, cache, ids[CONTEXT:], heads).items()}
    cases.update({(n, p): fn for (p, n), fn in
                  head_cases(target, cache, ids[CONTEXT:], [n for n in sizes if n <= 8]).items()})
    for fn in cases.values():  # warm-up: compiled functions are built per input shape
        timed(fn)
    times = {key: [] for key in cases}
    for _ in range(rounds):
        for key, fn in cases.items():
            times[key].append(timed(fn))
    return {key: statistics.median(ts) for key, ts in times.items()}


def report(dtype: str, med: dict, sizes: list[int]) -> None:
    drafting = ("head32", "head8", "head4", "target")
    parts = list(dict.fromkeys(p for n, p in med if n == sizes[0] and not p.startswith(drafting)))
    print(f"\n== dtype {dtype}: median ms ==")
    print(f"{'part':>11} " + " ".join(f"{n:>7}" for n in sizes) + f"  {sizes[-1]}/{sizes[0]}")
    rows = {p: [med[n, p] for n in sizes] for p in parts}
    summed = ("qkv", "o", "gate|up", "down", "attn-tree", "norm+rope")
    rows["rest"] = [med[n, "body"] - sum(med[n, p] for p in summed) for n in sizes]
    for p, ts in rows.items():
        ratio = f"  x{ts[-1] / ts[0]:.2f}" if ts[0] > 0 else ""
        print(f"{p:>11} " + " ".join(f"{t:>7.2f}" for t in ts) + ratio)
    heads = [p for p in dict.fromkeys(p for _, p in med) if p.startswith(drafting[:3])]
    if heads:
        base = med[1, "target"]
        print(f"EAGLE-3 head's draft forward (layer + draft logits) over n rows, ms (and as a "
              f"share of the target's 1-row forward, {base:.2f} ms):")
        for p in heads:
            ns = [n for n in sizes if (n, p) in med]
            print(f"{p:>11} " + " ".join(f"{n}: {med[n, p]:.2f} ({med[n, p] / base:.2f})" for n in ns))


def main(ref: str = "demo", rounds: str = "15", dtypes: str = "auto,float32",
         rows: str = "1,2,4,8,16") -> None:
    sizes = [int(r) for r in rows.split(",")]
    print(f"kernels: {native_summary()}; native: {native.status().reason or 'loaded'}")
    for dtype in dtypes.split(","):
        report(dtype, profile(ref, dtype, int(rounds), sizes), sizes)


if __name__ == "__main__":
    main(*sys.argv[1:])
