"""Whether a forward of N tokens gives each token the bits of scoring it alone (what greedy
speculation needs to reproduce plain decoding), for N around the native block's limit.

Usage: python scripts/verify_rows.py [MODEL] [DTYPE] [SIZES] — default demo, auto, 32,33,48,64.
After a 10-token prefix, scores N random tokens in one forward and the same N one at a time
(each committed), and prints whether the logits are equal bit for bit and their largest
difference. ``Target.exact_rows`` keeps the engine's verifies within the sizes that are.
"""

from __future__ import annotations

import sys

import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
import mlx.core as mx
import numpy as np

from edgespec.targets import load


def main(model: str = "demo", dtype: str = "auto", sizes: str = "32,33,48,64") -> None:
    target = load(model, dtype=dtype, progress=False)
    vocab = target.args.vocab_size
    ids = [int(i) for i in np.random.default_rng(1).integers(100, min(vocab, 40000), 80)]
    print(f"{model} {dtype}: exact_rows {target.exact_rows()}")
    for n in (int(s) for s in sizes.split(",")):
        together, alone = target.make_cache(), target.make_cache()
        for cache in (together, alone):
            mx.eval(target.score(ids[:10], cache).logits)
            cache.commit()
        want = np.array(target.score(ids[10 : 10 + n], together).logits)
        got = []
        for i in ids[10 : 10 + n]:
            got.append(np.array(target.score([i], alone).logits)[0])
            alone.commit()
        got = np.stack(got)
        print(f"  {n:3d} tokens: bits equal {np.array_equal(want, got)}, "
              f"largest difference {float(np.abs(want - got).max()):.3g}")


if __name__ == "__main__":
    main(*sys.argv[1:])
