// A forward's float32 products for the demo model (SmolLM2-135M: 30 layers of q|k|v, o,
// gate|up, down, each on its own cold weights, then the 49,152-row LM head) at M rows of x,
// with two builds of kernel_blocks.inc (base, new) taking turns in one process, split over
// the kernels' own thread pool in chunks as dispatch.cpp splits them. Prints each variant's
// median ms and the median of the per-round new/base ratios: on a shared machine, pairs in
// one process move together where separate processes do not. Exits 1 when the two variants'
// outputs differ in any bit. See scripts/kernel_ab.sh.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pool.h"

using RowsFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                        int64_t, int64_t, int64_t);
// kernel_avx2.cpp's rows_avx2, compiled twice with its namespace renamed (scripts/kernel_ab.sh)
namespace base { void rows_avx2(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t, int64_t, int64_t, int64_t); }
namespace fresh { void rows_avx2(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t, int64_t, int64_t, int64_t); }

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Job {
  RowsFn fn;
  const float *x, *w;
  float* y;
  int64_t M, N, K, rows;
};

void run_chunk(void* ctx, int64_t c) {
  const Job& j = *static_cast<Job*>(ctx);
  const int64_t n0 = c * j.rows, n1 = std::min(n0 + j.rows, j.N);
  j.fn(j.x, j.K, j.w, j.K, j.y, j.N, j.M, j.K, n0, n1);
}

void product(RowsFn fn, const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K) {
  int64_t rows = (32 * 1024 / K + 47) / 48 * 48;  // dispatch.cpp's chunks
  if (rows < 48) rows = 48;
  Job j{fn, x, w, y, M, N, K, rows};
  edgespec_native::Pool::get().run(run_chunk, &j, (N + rows - 1) / rows);
}

uint64_t checksum(const float* p, int64_t n, uint64_t h) {  // FNV-1a over the bits
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, p + i, 4);
    h = (h ^ u) * 1099511628211ULL;
  }
  return h;
}

float* filled(int64_t n, int seed) {
  auto* p = static_cast<float*>(aligned_alloc(64, (n * 4 + 63) / 64 * 64));
  for (int64_t i = 0; i < n; ++i) p[i] = ((i * 7 + seed) % 977) * 1e-3f - 0.5f;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t M = argc > 1 ? atoi(argv[1]) : 16;
  const int rounds = argc > 2 && atoi(argv[2]) > 0 ? atoi(argv[2]) : 15;
  const int64_t shapes[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
  std::vector<float*> ws;
  for (int l = 0; l < 30; ++l)
    for (auto& s : shapes) ws.push_back(filled(s[0] * s[1], l));
  float* head = filled(49152LL * 576, 99);
  std::vector<float> x(M * 1536), y(M * 49152);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 131) * 0.01f - 0.6f;
  const RowsFn fns[2] = {base::rows_avx2, fresh::rows_avx2};
  // Every product's outputs, hashed per variant in an untimed first pass: the two
  // must agree bit for bit (a change that moves the sums' order is a different contract).
  auto forward = [&](RowsFn fn, uint64_t* sum) {
    for (int l = 0; l < 30; ++l)
      for (int s = 0; s < 4; ++s) {
        product(fn, x.data(), ws[l * 4 + s], y.data(), M, shapes[s][0], shapes[s][1]);
        if (sum) *sum = checksum(y.data(), M * shapes[s][0], *sum);
      }
    product(fn, x.data(), head, y.data(), M, 49152, 576);
    if (sum) *sum = checksum(y.data(), M * 49152, *sum);
  };
  uint64_t sums[2] = {0, 0};
  for (int v = 0; v < 2; ++v) forward(fns[v], &sums[v]);  // also warms the pool and the pages
  if (sums[0] != sums[1]) {
    std::printf("%3ld rows: the variants' outputs differ in their bits\n", static_cast<long>(M));
    return 1;
  }
  std::vector<double> t[2];
  for (int r = 0; r < rounds; ++r)
    for (int i = 0; i < 2; ++i) {
      const int v = (i + r) % 2;  // the order alternates from round to round
      const double t0 = now();
      forward(fns[v], nullptr);
      t[v].push_back((now() - t0) * 1e3);
    }
  std::vector<double> ratio;
  int faster = 0;
  for (int r = 0; r < rounds; ++r) {
    ratio.push_back(t[1][r] / t[0][r]);
    faster += t[1][r] < t[0][r];
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t h = v.size() / 2;
    return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
  };
  std::printf("%3ld rows: base %6.2f ms  new %6.2f ms  new/base %.3f (new faster in %d of %d rounds)\n",
              static_cast<long>(M), median(t[0]), median(t[1]), median(ratio), faster, rounds);
}
