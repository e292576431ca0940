// What the kernel A/B drivers share (scripts/kernel_ab/main.cpp, scripts/q8_kernel_ab/main.cpp):
// two builds of a kernel (base, new) run a forward's products in one process; compare_pair
// hashes both variants' outputs in an untimed first pass (they must agree bit for bit: a change
// that moves the sums' order is a different contract), then times them in turns and prints each
// one's median ms and the median of the per-round new/base ratios (on a shared machine, pairs
// in one process move together where separate processes do not).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace ab {

inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline uint64_t checksum(const float* p, int64_t n, uint64_t h) {  // FNV-1a over the bits
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, p + i, 4);
    h = (h ^ u) * 1099511628211ULL;
  }
  return h;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// forward(v, sum): variant v's (0: base, 1: new) products, each output folded into *sum by
// checksum where sum is not null. label names the case ("  1 rows, 4-bit"). Returns the
// program's exit status: 1 when the variants' bits differ, else 0.
template <typename Forward>
int compare_pair(Forward forward, int rounds, const char* label) {
  uint64_t sums[2] = {0, 0};
  for (int v = 0; v < 2; ++v) forward(v, &sums[v]);  // also warms the pool and the pages
  if (sums[0] != sums[1]) {
    std::printf("%s: the variants' outputs differ in their bits\n", label);
    return 1;
  }
  std::vector<double> t[2];
  for (int r = 0; r < rounds; ++r)
    for (int i = 0; i < 2; ++i) {
      const int v = (i + r) % 2;  // the order alternates from round to round
      const double t0 = now();
      forward(v, nullptr);
      t[v].push_back((now() - t0) * 1e3);
    }
  std::vector<double> ratio;
  int faster = 0;
  for (int r = 0; r < rounds; ++r) {
    ratio.push_back(t[1][r] / t[0][r]);
    faster += t[1][r] < t[0][r];
  }
  std::printf("%s: base %6.2f ms  new %6.2f ms  new/base %.3f (new faster in %d of %d rounds)\n",
              label, median(t[0]), median(t[1]), median(ratio), faster, rounds);
  return 0;
}

}  // namespace ab
