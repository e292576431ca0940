// A forward's products for the demo model (SmolLM2-135M: 30 layers of q|k|v, o, gate|up, down,
// each on its own cold weights, then the 49,152-row LM head) at M rows of x, with two builds of
// a kernel (base, new) taking turns in one process, split over the kernels' own thread pool in
// chunks as the module splits them. BITS 32: the float32 kernel (kernel_blocks.inc, rows_avx2;
// dispatch.cpp's chunks); 8 or 4: the quantized kernel on weights in MLX's affine layout, group
// 32 (kernel_q_blocks.inc, qrows_avx2, the per-block kernel that runs up to 8 rows;
// quantized_matmul.cpp's chunks). Prints each variant's median ms and the median of the
// per-round new/base ratios: on a shared machine, pairs in one process move together where
// separate processes do not. Exits 1 when the two variants' outputs differ in any bit. See
// scripts/kernel_ab.sh.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "pool.h"
#include "ab_pair.h"

using RowsFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                        int64_t, int64_t, int64_t);
using QRowsFn = void (*)(int, const float*, int64_t, const uint8_t*, int64_t, const float*,
                         const float*, int64_t, float*, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, float*);
// kernel_avx2.cpp's rows_avx2 and kernel_q_avx2.cpp's qrows_avx2, each compiled twice with its
// namespace renamed (scripts/kernel_ab.sh)
#define EDGESPEC_AB_VARIANT(ns)                                                               \
  namespace ns {                                                                              \
  void rows_avx2(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t,      \
                 int64_t, int64_t, int64_t);                                                  \
  void qrows_avx2(int, const float*, int64_t, const uint8_t*, int64_t, const float*,          \
                  const float*, int64_t, float*, int64_t, int64_t, int64_t, int64_t, int64_t, \
                  int64_t, float*);                                                           \
  }
EDGESPEC_AB_VARIANT(base)
EDGESPEC_AB_VARIANT(fresh)

namespace {

constexpr int64_t kGroup = 32;  // the quantized weights' group size

// One weight matrix (N, K): float32, or packed (bits) with its scales and biases.
struct Weight {
  int64_t N, K;
  const float* w;     // float32
  const uint8_t* q;   // quantized
  const float *s, *b;
};

struct Job {
  RowsFn fn;
  QRowsFn qfn;
  int bits;
  const float* x;
  Weight w;
  float* y;
  int64_t M, rows;
};

void run_chunk(void* ctx, int64_t c) {
  const Job& j = *static_cast<Job*>(ctx);
  const int64_t n0 = c * j.rows, n1 = std::min(n0 + j.rows, j.w.N), K = j.w.K;
  if (j.bits == 32)
    j.fn(j.x, K, j.w.w, K, j.y, j.w.N, j.M, K, n0, n1);
  else
    j.qfn(j.bits, j.x, K, j.w.q, K * j.bits / 8, j.w.s, j.w.b, K / kGroup, j.y, j.w.N, j.M, K,
          kGroup, n0, n1, nullptr);
}

void product(RowsFn fn, QRowsFn qfn, int bits, const float* x, const Weight& w, float* y,
             int64_t M) {
  // dispatch.cpp's chunks (float32) or quantized_matmul.cpp's
  const int64_t unit = bits == 32 ? 48 : 4;
  const int64_t rows = std::max(unit, (32 * 1024 / w.K + unit - 1) / unit * unit);
  Job j{fn, qfn, bits, x, w, y, M, rows};
  edgespec_native::Pool::get().run(run_chunk, &j, (w.N + rows - 1) / rows);
}

float* filled(int64_t n, int seed) {
  auto* p = static_cast<float*>(aligned_alloc(64, (n * 4 + 63) / 64 * 64));
  for (int64_t i = 0; i < n; ++i) p[i] = ((i * 7 + seed) % 977) * 1e-3f - 0.5f;
  return p;
}

Weight weight(int64_t N, int64_t K, int bits, int seed) {
  if (bits == 32) return {N, K, filled(N * K, seed), nullptr, nullptr, nullptr};
  const int64_t bytes = N * K * bits / 8;
  auto* q = static_cast<uint8_t*>(aligned_alloc(64, (bytes + 63) / 64 * 64));
  for (int64_t i = 0; i < bytes; ++i) q[i] = static_cast<uint8_t>((i * 131 + seed) >> 3);
  float* s = filled(N * K / kGroup, seed + 1);
  float* b = filled(N * K / kGroup, seed + 2);
  for (int64_t i = 0; i < N * K / kGroup; ++i) s[i] = 0.01f + s[i] * 0.01f;
  return {N, K, nullptr, q, s, b};
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t M = argc > 1 ? atoi(argv[1]) : 16;
  const int rounds = argc > 2 && atoi(argv[2]) > 0 ? atoi(argv[2]) : 15;
  const int bits = argc > 3 ? atoi(argv[3]) : 32;
  if (bits != 32 && bits != 8 && bits != 4) {
    std::printf("bits must be 32 (float32), 8 or 4, not %d\n", bits);
    return 2;
  }
  const int64_t shapes[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
  std::vector<Weight> ws;
  for (int l = 0; l < 30; ++l)
    for (auto& s : shapes) ws.push_back(weight(s[0], s[1], bits, l));
  ws.push_back(weight(49152, 576, bits, 99));  // the head
  std::vector<float> x(M * 1536), y(M * 49152);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 131) * 0.01f - 0.6f;
  const RowsFn fns[2] = {base::rows_avx2, fresh::rows_avx2};
  const QRowsFn qfns[2] = {base::qrows_avx2, fresh::qrows_avx2};
  // Every product's outputs, hashed per variant in an untimed first pass: the two
  // must agree bit for bit (a change that moves the sums' order is a different contract).
  auto forward = [&](int v, uint64_t* sum) {
    for (const Weight& w : ws) {
      product(fns[v], qfns[v], bits, x.data(), w, y.data(), M);
      if (sum) *sum = ab::checksum(y.data(), M * w.N, *sum);
    }
  };
  char label[32];
  std::snprintf(label, sizeof label, "%3ld rows, %2d-bit", static_cast<long>(M), bits);
  return ab::compare_pair(forward, rounds, label);
}
