// A forward's int8-activation products for the demo model's GGUF (SmolLM2-135M: 30 layers of
// q|k|v, o, gate|up, down, each on its own cold weights, then the 49,152-row LM head) at M rows
// of x, with two builds of kernel_q8_avx512.cpp (base, new) taking turns in one process, split
// over the kernels' own thread pool in chunks as quantized_matmul.cpp splits them. BITS 4: the
// Q4_1 file's form (4-bit blocks with float16 scales and biases, an 8-bit symmetric head,
// Q8_0's); 8: its q8_0 copy (every product 8-bit symmetric). Group 32. Each variant rounds x
// with its own q8quantize_avx512, once per product as the module does, into strides that hold
// either layout (an earlier revision's group layout's 512 bytes a step, the lane layout's 32
// floats). Prints each variant's median ms and the median of the per-round new/base ratios.
// Exits 1 when the two variants' outputs differ in any bit. See scripts/q8_kernel_ab.sh.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "pool.h"
#include "../kernel_ab/ab_pair.h"

using QuantizeFn = void (*)(int, const float*, int64_t, int64_t, int64_t, int8_t*, int64_t,
                            float*, float*, int64_t);
using Q8RowsFn = void (*)(int, const int8_t*, int64_t, const float*, const float*, int64_t,
                          const uint8_t*, int64_t, const void*, const void*, bool, int64_t,
                          float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
// kernel_q8_avx512.cpp's entry points, compiled twice with the namespace renamed
#define EDGESPEC_AB_VARIANT(ns)                                                               \
  namespace ns {                                                                              \
  void q8quantize_avx512(int, const float*, int64_t, int64_t, int64_t, int8_t*, int64_t,      \
                         float*, float*, int64_t);                                            \
  void q8rows_avx512vnni(int, const int8_t*, int64_t, const float*, const float*, int64_t,    \
                         const uint8_t*, int64_t, const void*, const void*, bool, int64_t,    \
                         float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);       \
  }
EDGESPEC_AB_VARIANT(base)
EDGESPEC_AB_VARIANT(fresh)

namespace {

constexpr int64_t kGroup = 32;

// One packed weight (N, K) with float16 scales and biases (b null: symmetric, made from the
// scales by the kernel).
struct Weight {
  int64_t N, K;
  int bits;
  const uint8_t* q;
  const uint16_t *s, *b;
};

struct Job {
  Q8RowsFn fn;
  const int8_t* xr;
  const float *xd, *xs;
  int64_t ldr, ldf;
  Weight w;
  float* y;
  int64_t M, rows;
};

void run_chunk(void* ctx, int64_t c) {
  const Job& j = *static_cast<Job*>(ctx);
  const int64_t n0 = c * j.rows, n1 = std::min(n0 + j.rows, j.w.N), K = j.w.K;
  j.fn(j.w.bits, j.xr, j.ldr, j.xd, j.xs, j.ldf, j.w.q, K * j.w.bits / 8, j.w.s, j.w.b, true,
       K / kGroup, j.y, j.w.N, j.M, K, kGroup, n0, n1);
}

// x rounded (the room past M and K zero), then quantized_matmul.cpp's chunks
void product(QuantizeFn quantize, Q8RowsFn fn, const float* x, const Weight& w, float* y,
             int64_t M, std::vector<int8_t>& xr, std::vector<float>& xf) {
  const int64_t steps = (w.K + 127) / 128, ldr = steps * 512, ldf = steps * 32;
  const int64_t units = std::max<int64_t>(M, (M + 3) / 4);
  xr.assign(units * ldr, 0);
  xf.assign(2 * units * ldf, 0.0f);
  quantize(w.bits, x, w.K, M, w.K, xr.data(), ldr, xf.data(), xf.data() + units * ldf, ldf);
  // as quantized_matmul.cpp: on multiples of 16 columns where the wide form runs (from
  // kernel_q.h's kQ8WideRows rows on; its value here, since both variants share this driver)
  const int64_t block = M >= 9 ? 16 : 4;
  const int64_t rows = std::max<int64_t>(block, (32 * 1024 / w.K + block - 1) / block * block);
  Job j{fn, xr.data(), xf.data(), xf.data() + units * ldf, ldr, ldf, w, y, M, rows};
  edgespec_native::Pool::get().run(run_chunk, &j, (w.N + rows - 1) / rows);
}

uint16_t* halves(int64_t n, int seed, uint16_t base) {  // float16 numbers near 2^-7 (or -2^-7)
  auto* p = static_cast<uint16_t*>(aligned_alloc(64, (n * 2 + 63) / 64 * 64));
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint16_t>(base + (i * 37 + seed) % 1021);
  return p;
}

Weight weight(int64_t N, int64_t K, int bits, bool symmetric, int seed) {
  const int64_t bytes = N * K * bits / 8;
  auto* q = static_cast<uint8_t*>(aligned_alloc(64, (bytes + 63) / 64 * 64));
  for (int64_t i = 0; i < bytes; ++i) q[i] = static_cast<uint8_t>((i * 131 + seed) >> 3);
  return {N, K, bits, q, halves(N * K / kGroup, seed, 0x2000),
          symmetric ? nullptr : halves(N * K / kGroup, seed + 1, 0xa000)};
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t M = argc > 1 ? atoi(argv[1]) : 1;
  const int rounds = argc > 2 && atoi(argv[2]) > 0 ? atoi(argv[2]) : 15;
  const int bits = argc > 3 ? atoi(argv[3]) : 4;
  if (bits != 8 && bits != 4) {
    std::printf("bits must be 4 (the Q4_1 file) or 8 (its q8_0 copy), not %d\n", bits);
    return 2;
  }
  if (M < 1 || M > 64) {
    std::printf("rows must be 1..64, not %ld\n", static_cast<long>(M));
    return 2;
  }
  const int64_t shapes[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
  std::vector<Weight> ws;
  for (int l = 0; l < 30; ++l)
    for (auto& s : shapes) ws.push_back(weight(s[0], s[1], bits, bits == 8, l));
  ws.push_back(weight(49152, 576, 8, true, 99));  // the head: Q8_0 in both files
  std::vector<float> x(M * 1536), y(M * 49152);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 131) * 0.01f - 0.6f;
  const QuantizeFn quantize[2] = {base::q8quantize_avx512, fresh::q8quantize_avx512};
  const Q8RowsFn fns[2] = {base::q8rows_avx512vnni, fresh::q8rows_avx512vnni};
  std::vector<int8_t> xr;
  std::vector<float> xf;
  auto forward = [&](int v, uint64_t* sum) {
    for (const Weight& w : ws) {
      product(quantize[v], fns[v], x.data(), w, y.data(), M, xr, xf);
      if (sum) *sum = ab::checksum(y.data(), M * w.N, *sum);
    }
  };
  char label[32];
  std::snprintf(label, sizeof label, "%3ld rows, %d-bit", static_cast<long>(M), bits);
  return ab::compare_pair(forward, rounds, label);
}
