// AVX2 + FMA form of kernel.h's contract (compiled with -mavx2 -mfma only; see kernel.h).
#include <immintrin.h>

#include <cstdint>

namespace edgespec_native {
namespace {

inline __m256 tail256(const float* p, int r) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(r), lane));
}

inline float sum256(__m256 v) {  // (lo + hi), then pairs: a fixed order
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#define VEC __m256
#define LANES 8
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VLOAD_TAIL(p, r) tail256((p), (r))
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VSUM(v) sum256(v)
#define ROWS_FN rows_avx2_impl
#define MB_MAX 4
#define NB_MAX 3
#define NB1_MAX 12
#include "kernel_blocks.inc"

}  // namespace

void rows_avx2(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
               int64_t ldy, int64_t M, int64_t K, int64_t n0, int64_t n1) {
  rows_avx2_impl(x, ldx, w, ldw, y, ldy, M, K, n0, n1);
}

float fma_loop_avx2(int64_t iters) {
  // 12 independent chains: enough to cover the FMA latency on the cores measured
  __m256 acc[12];
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (int j = 0; j < 12; ++j) acc[j] = _mm256_set1_ps(1.0f + 0.01f * j);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  float s = 0.0f;
  for (int j = 0; j < 12; ++j) s += sum256(acc[j]);
  return s;
}

}  // namespace edgespec_native
