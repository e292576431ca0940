#!/usr/bin/env bash
# The int8 forward's SiLU exp (edgespec/kernels/native/expf_avx2.cpp) against the C library's
# expf for every float input below 88 in magnitude (the larger ones, NaN and infinities take
# expf itself): prints how many differ (0 is the contract). Also counts the inputs where glibc's
# algorithm evaluated without fused multiply-adds (its non-FMA build, musl's) differs from the C
# library's, and prints up to 16 of them: block.cpp's load-time check includes those, so that a
# C library without the fused form turns the vector path off. ~15-30 s on one core.
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
#include <vector>
#include "expf_libm.h"
// expf_avx2.cpp's table of 2^(i/32) (glibc's), copied out of its source by the script
static const uint64_t kTable[32] = {
#include "table.inc"
};
// glibc's expf algorithm with every product and sum rounded on its own (this file is compiled
// with -ffp-contract=off).
static float expf_unfused(float x) {
  const double inv = 0x1.71547652b82fep+5, shift = 0x1.8p+52;
  const double c0 = 0x1.c6af84b912394p-5 / 32768.0, c1 = 0x1.ebfce50fac4f3p-3 / 1024.0,
               c2 = 0x1.62e42ff0c52d6p-1 / 32.0;
  const double z = inv * double(x);
  double kd = z + shift;
  uint64_t ki;
  std::memcpy(&ki, &kd, 8);
  kd -= shift;
  const double r = z - kd;
  uint64_t t = kTable[ki % 32] + (ki << 47);
  double s;
  std::memcpy(&s, &t, 8);
  const double zz = c0 * r + c1, r2 = r * r;
  double y = c2 * r + 1;
  y = zz * r2 + y;
  return float(y * s);
}
int main() {
  constexpr int64_t kBatch = 1 << 16;
  static float x[kBatch], y[kBatch];
  uint64_t checked = 0, differ = 0;
  std::vector<uint32_t> unfused;
  for (uint64_t b0 = 0; b0 < (uint64_t(1) << 32); b0 += kBatch) {
    int64_t n = 0;
    for (int64_t i = 0; i < kBatch; ++i) {
      const uint32_t u = uint32_t(b0 + i);
      if (((u >> 20) & 0x7ff) >= 0x42b) continue;  // expf's own lanes
      std::memcpy(&x[n++], &u, 4);
    }
    const int64_t vec = n - n % 4;
    edgespec_native::expf_avx2(x, y, vec, true);
    for (int64_t i = 0; i < vec; ++i) {
      const float want = std::exp(-x[i]), other = expf_unfused(-x[i]);
      differ += std::memcmp(&y[i], &want, 4) != 0;
      if (std::memcmp(&other, &want, 4) != 0) {
        uint32_t u;
        std::memcpy(&u, &x[i], 4);
        unfused.push_back(u);
      }
    }
    checked += vec;
  }
  std::printf("expf_avx2: %llu inputs, %llu differ from the C library's expf\n",
              (unsigned long long)checked, (unsigned long long)differ);
  const size_t shown = unfused.size() < 16 ? unfused.size() : 16;
  std::printf("unfused evaluation: %zu inputs differ from the C library's expf; %zu of them:\n",
              unfused.size(), shown);
  for (size_t i = 0; i < shown; ++i)
    std::printf("0x%08x%s", unfused[i * unfused.size() / shown], i + 1 == shown ? "\n" : ", ");
  return differ != 0;
}
CPP
sed -n '/kExp2Table\[32\] = {/,/};/p' "$src/expf_avx2.cpp" | sed '1d;$s/};//' >"$work/table.inc"
${CXX:-g++} -O2 -std=c++17 -ffp-contract=off -I"$src" -I"$work" "$work/main.cpp" -x c++ \
  "$src/expf_avx2.cpp" -mavx2 -mfma -o "$work/check"
"$work/check"
