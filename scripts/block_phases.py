"""Where the native decoder block's time goes, phase by phase, inside a real forward.

Usage: python scripts/block_phases.py [ROWS] [WORDS] [MODEL] [DTYPE] — builds a throwaway copy
of the native module whose ``run_block`` (edgespec/kernels/native/block.cpp) reads the clock
between its phases (the norms, the four products, RoPE, attention, SiLU, the residuals) and
between one block's end and the next one's start, then, with that copy loaded
(``EDGESPEC_NATIVE_DIR``), decodes and prints the mean microseconds a block spends in each
phase, for blocks over ROWS rows only (default 1):

- ROWS 1: plain decoding, 3 x 256 greedy tokens asked for (a story) after the README's first
  WORDS words (default 30: a short context; 1000 gives ~1,400 tokens), MODEL (default ``demo``) loaded
  with DTYPE (default ``auto``: the demo's 4-bit weights);
- ROWS > 1: ``scripts/quantized_step_profile.py MODEL 10 DTYPE ROWS`` (trees and chains of
  ROWS tokens after 128 of context).

``gap`` is the time from a block's end to the next block's start when that is under 200 us (the
operations MLX runs between two blocks: the cache's slice updates, buffer releases), and
``queued`` the same for the gaps whose next block was handed to MLX's stream before the block
before it ended (so the stream had it and did not wait for the host). The clock reads cost a
few hundredths of a microsecond each. The module under test is never touched: the copy lives in
a temporary folder. Run it on a quiet machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "edgespec" / "kernels" / "native"

PROFILE = '''#include <chrono>
#include <cstdio>
#include <cstdlib>
namespace edgespec_native { namespace prof {
inline double now_us() {
  return std::chrono::duration<double, std::micro>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
}
const long rows = std::getenv("EDGESPEC_PROFILE_ROWS") ? std::atol(std::getenv("EDGESPEC_PROFILE_ROWS")) : 1;
double total[12], last_end = 0, gap = 0, queued_gap = 0;
long blocks = 0, gaps = 0, queued = 0;
const char* names[12] = {"norm 1", "q|k|v", "rope", "attention", "copy out", "o", "residual",
                         "norm 2", "gate|up", "silu", "down", "residual"};
struct Report {
  ~Report() {
    if (!blocks) return;
    double all = 0;
    std::fprintf(stderr, "blocks over %ld rows: %ld\\n", rows, blocks);
    for (int i = 0; i < 12; ++i) {
      std::fprintf(stderr, "%10s %8.2f us\\n", names[i], total[i] / blocks);
      all += total[i];
    }
    std::fprintf(stderr, "%10s %8.2f us\\n%10s %8.2f us (%ld gaps)\\n%10s %8.2f us (%ld gaps)\\n",
                 "block", all / blocks, "gap", gaps ? gap / gaps : 0.0, gaps, "queued",
                 queued ? queued_gap / queued : 0.0, queued);
  }
} report;
}}
'''

# (anchor in block.cpp, text put after it): the phase marks of run_block
MARKS = [
    ('#include "tree_attention.h"\n', PROFILE),
    ('  // without slicing a shared output first).\n  std::vector<float*> k_out, v_out;\n',
     '  double handed = 0;  // when eval_cpu gave it to the stream (0: a stack\'s later layers)\n'),
    ('void run_block(const BlockJob& j) {\n',
     '  const bool on = j.N == prof::rows;\n  double t0 = prof::now_us(), t;\n'
     '  if (on && prof::last_end > 0 && t0 - prof::last_end < 200) {\n'
     '    prof::gap += t0 - prof::last_end, ++prof::gaps;\n'
     '    if (j.handed < prof::last_end) prof::queued_gap += t0 - prof::last_end, ++prof::queued;\n'
     '  }\n  if (on) ++prof::blocks;\n'
     '#define MARK(i) t = prof::now_us(); if (on) prof::total[i] += t - t0; t0 = t;\n'),
]
# (text in run_block, the same text with marks around it)
AROUND = [
    ('  product(j.w[QKV], j.q8, xn, N, K, y, nqkv);\n', 'MARK(0)\n', ''),
    ('  qkv_rope_rows(r);\n', 'MARK(1)\n', 'MARK(2)\n'),
    ('  run_tree_attention_many(calls, true);\n', '', 'MARK(3)\n'),
    ('  product(j.w[O], j.q8, attn_rows, N, nq, hdn, H);\n', 'MARK(4)\n', 'MARK(5)\n'),
    ('  rms_rows(hdn, H, j.n2, xn, H, N, H, s.eps);\n', 'MARK(6)\n', 'MARK(7)\n'),
    ('  product(j.w[GU], j.q8, xn, N, H, g, 2 * I);\n', '', 'MARK(8)\n'),
    ('  product(j.w[DOWN], j.q8, act, N, I, j.out, H);\n', 'MARK(9)\n', 'MARK(10)\n'),
    ('  for (int64_t i = 0; i < N * H; ++i) j.out[i] += hdn[i];\n}\n', '',
     None),  # the last: closes run_block
    ('  encoder.dispatch([job = std::move(job)]() { run_block(job); });\n',
     '  job.handed = prof::now_us();\n', ''),
]


def instrumented(src: str) -> str:
    for anchor, text in MARKS:
        if src.count(anchor) != 1:
            sys.exit(f"block_phases: block.cpp changed: {anchor.strip()!r} is not there once; "
                     "update MARKS")
        src = src.replace(anchor, anchor + text)
    for line, before, after in AROUND:
        if src.count(line) != 1:
            sys.exit(f"block_phases: block.cpp changed: {line.strip()!r} is not there once; "
                     "update AROUND")
        if after is None:  # the closing residual: mark, remember the end, close
            body = line[: -len("}\n")]
            src = src.replace(line, body + "MARK(11)\n  prof::last_end = t0;\n}\n")
        else:
            src = src.replace(line, before + line + after)
    return src


def build(into: Path) -> Path:
    src = into / "src"
    shutil.copytree(SOURCES, src, ignore=shutil.ignore_patterns("build", "__pycache__"))
    (src / "block.cpp").write_text(instrumented((src / "block.cpp").read_text()))
    out = into / "build"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    for cmd in (["cmake", "-S", str(src), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", "-G", "Ninja"],
                ["cmake", "--build", str(out)]):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode:
            sys.exit(f"block_phases: {' '.join(cmd[:2])} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return out


DECODE = '''
import sys
import edgespec  # noqa: F401  (loads the optimized BLAS before mlx)
from edgespec.engine import Engine
from edgespec.kernels import native
from edgespec.targets import load
assert native.load() is not None, native.status().reason
target = load(sys.argv[1], dtype=sys.argv[2], progress=False)
words = open(sys.argv[4]).read().split()[: int(sys.argv[3])]
chat = [{"role": "user", "content": " ".join(words) + "\\n\\nWrite a long story about a lighthouse keeper."}]
engine = Engine(target, None)
for _ in engine.stream(chat, max_tokens=8):
    pass
for _ in range(3):
    for _ in engine.stream(chat, max_tokens=256):
        pass
'''


def main(rows: str = "1", words: str = "30", model: str = "demo", dtype: str = "auto") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        print("building an instrumented copy of the native module ...", file=sys.stderr)
        out = build(Path(tmp))
        env = {**os.environ, "EDGESPEC_NATIVE_DIR": str(out), "EDGESPEC_PROFILE_ROWS": rows}
        if int(rows) == 1:
            cmd = [sys.executable, "-c", DECODE, model, dtype, words, str(ROOT / "README.md")]
        else:
            cmd = [sys.executable, str(ROOT / "scripts" / "quantized_step_profile.py"), model,
                   "10", dtype, rows]
        subprocess.run(cmd, env=env, cwd=ROOT, check=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
