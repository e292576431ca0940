// One variant of kernel_blocks.inc in its own namespace (VARIANT_NS, from VARIANT_INC), as
// kernel_avx2.cpp compiles it: scripts/kernel_ab.sh builds two of these into one program.
#include <immintrin.h>

#include <cstdint>

#include "avx2_sum.h"

namespace VARIANT_NS {
using namespace edgespec_native;
namespace {
inline __m256 tail256(const float* p, int r) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(r), lane));
}
#define VEC __m256
#define LANES 8
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VLOAD_TAIL(p, r) tail256((p), (r))
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VSET1(s) _mm256_set1_ps(s)
#define VSUM(v) sum256(v)
#define VSUM4(a, b, c, d, out) sum4_256((a), (b), (c), (d), (out))
#define ROWS_FN rows_impl
#define MB_MAX 4
#define NB_MAX 3
#define NB1_MAX 4
#define FMA_LOOP_FN fma_impl
#include VARIANT_INC
}  // namespace
void rows(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
          int64_t M, int64_t K, int64_t n0, int64_t n1) {
  rows_impl(x, ldx, w, ldw, y, ldy, M, K, n0, n1);
}
}  // namespace VARIANT_NS
