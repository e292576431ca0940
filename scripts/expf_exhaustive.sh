#!/usr/bin/env bash
# The int8 forward's SiLU exp (edgespec/kernels/native/expf_avx2.cpp) against the C library's
# expf for every one of the 2^32 float inputs below 88 in magnitude (the larger ones, NaN and
# infinities take expf itself): prints how many differ (0 is the contract). ~30 s on one core.
#   scripts/expf_exhaustive.sh
set -euo pipefail
root=$(git rev-parse --show-toplevel)
src=$root/edgespec/kernels/native
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/main.cpp" <<'CPP'
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include "expf_libm.h"
int main() {
  constexpr int64_t kBatch = 1 << 16;
  static float x[kBatch], y[kBatch];
  uint64_t checked = 0, differ = 0;
  for (uint64_t b0 = 0; b0 < (uint64_t(1) << 32); b0 += kBatch) {
    for (int64_t i = 0; i < kBatch; ++i) {
      const uint32_t u = uint32_t(b0 + i);
      std::memcpy(&x[i], &u, 4);
      if (((u >> 20) & 0x7ff) >= 0x42b) x[i] = 0.0f;  // expf's own lanes
    }
    edgespec_native::expf_avx2(x, y, kBatch, true);
    for (int64_t i = 0; i < kBatch; ++i) {
      const float want = std::exp(-x[i]);
      differ += std::memcmp(&y[i], &want, 4) != 0;
    }
    checked += kBatch;
  }
  std::printf("expf_avx2: %llu inputs, %llu differ from the C library's expf\n",
              (unsigned long long)checked, (unsigned long long)differ);
  return differ != 0;
}
CPP
${CXX:-g++} -O2 -std=c++17 -I"$src" "$work/main.cpp" -x c++ "$src/expf_avx2.cpp" -mavx2 -mfma \
  -o "$work/check"
"$work/check"
