"""Each family config of ``tests/oracle.py`` against mlx-lm on tiny random weights, as a table:
the largest |logit difference| (float32) of a prefill, a decode chain after 340 tokens (sliding
windows compacted), a draft tree, and the same prefill quantized as ``mlx_lm.convert`` does
(4-bit, group 32) and kept quantized (with the native kernels, and with MLX's own quantized
products as the oracle runs them); and whether greedy lookup and the self-draft oracle give
plain decoding's tokens. What ``tests/test_families.py`` asserts, written out for the docs.

    python scripts/oracle_table.py [--match gemma4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import edgespec  # noqa: F401  (first: it loads the optimized BLAS before MLX starts)
import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.oracle import (CONFIGS, load_oracle, make_oracle_model, oracle_decode,  # noqa: E402
                          oracle_logits)

from edgespec import Engine, SamplingConfig  # noqa: E402
from edgespec.drafters.draft_model import DraftModelDrafter  # noqa: E402
from edgespec.drafters.lookup import PromptLookupDrafter  # noqa: E402
from edgespec.kernels.backend import set_native_enabled  # noqa: E402
from edgespec.targets import load_target  # noqa: E402
from edgespec.tree import DraftTree  # noqa: E402

PROMPT = "the cat sat on the mat and then the cat sat on the mat again"


def _ids(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 250, n)]


def _diff(ours, want) -> float:
    return float(np.max(np.abs(np.array(ours) - want)))


def row(name: str, root: Path) -> dict:
    path = make_oracle_model(root / name, CONFIGS[name])
    target, oracle = load_target(path, dtype="float32"), load_oracle(path)
    ids = _ids(40, 1)
    out = {"config": name, "prefill": _diff(target.score(ids, target.make_cache()).logits,
                                            oracle_logits(oracle, ids))}
    ids = _ids(352, 2)
    cache = target.make_cache()
    target.score(ids[:340], cache, head=False)
    cache.commit()
    out["decode"] = _diff(target.score(ids[340:], cache).logits, oracle_decode(oracle, ids[:340], ids[340:]))
    ids = _ids(20, 3)
    tree = DraftTree([ids[-1], 11, 12, 13, 14, 15, 16, 17, 18], [-1, 0, 0, 1, 1, 2, 3, 6, 7])
    cache = target.make_cache()
    target.score(ids[:-1], cache, head=False)
    cache.commit()
    logits = np.array(target.score(tree, cache).logits)
    out["tree"] = max(_diff(logits[u], oracle_logits(oracle, ids[:-1] + [tree.tokens[i] for i in
                                                                          tree.path_to(u)])[-1])
                      for u in range(len(tree)))
    plain = Engine(target).generate(PROMPT, max_tokens=32).token_ids
    lookup = Engine(target, PromptLookupDrafter(max_branches=3)).generate(PROMPT, max_tokens=32)
    self_draft = DraftModelDrafter(target, SamplingConfig(), num_draft=3, max_draft=3, adaptive=False)
    out["greedy_exact"] = (lookup.token_ids == plain and
                           Engine(target, self_draft).generate(PROMPT, max_tokens=32).token_ids == plain)
    out["4bit_prefill"] = _quantized(name, root)
    return out


def _quantized(name: str, root: Path) -> tuple[float, float]:
    """(native kernels, MLX's quantized products) max |logit difference| of a 4-bit prefill."""
    from mlx_lm.utils import quantize_model

    path = make_oracle_model(root / f"{name}-4bit", CONFIGS[name])
    config = json.loads((path / "config.json").read_text())
    model, config = quantize_model(load_oracle(path), config, group_size=32, bits=4)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (path / "config.json").write_text(json.dumps(config))
    target, oracle = load_target(path, dtype="auto"), load_oracle(path)
    ids, native = _ids(24, 9), []
    want = oracle_logits(oracle, ids)
    for enabled in (True, False):
        set_native_enabled(enabled)
        native.append(_diff(target.score(ids, target.make_cache()).logits, want))
    set_native_enabled(True)
    return native[0], native[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--match", default="gemma4", help="configs whose name contains this")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    names = [n for n in CONFIGS if args.match in n]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [row(n, Path(tmp)) for n in names]
    import mlx_lm
    print(f"{time.strftime('%Y-%m-%d')}, mlx {mx.__version__}, mlx-lm {mlx_lm.__version__}, "
          f"float32 unless 4-bit; max |logit difference| vs mlx-lm")
    print("| config | prefill | decode after 340 | tree | 4-bit prefill (native / MLX products) "
          "| greedy lookup, self-draft = plain |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        q = r["4bit_prefill"]
        print(f"| {r['config']} | {r['prefill']:.1e} | {r['decode']:.1e} | {r['tree']:.1e} | "
              f"{q[0]:.1e} / {q[1]:.1e} | {'yes' if r['greedy_exact'] else 'NO'} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
