// AVX-512F form of kernel.h's contract (compiled with -mavx512f -mfma only; see kernel.h).
#include <immintrin.h>

#include <cstdint>

#include "avx512_sum.h"

namespace edgespec_native {
namespace {

inline __m512 tail512(const float* p, int r) {
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << r) - 1u), p);
}

#define VEC __m512
#define LANES 16
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VLOAD_TAIL(p, r) tail512((p), (r))
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VSET1(s) _mm512_set1_ps(s)
#define VSUM(v) _mm512_reduce_add_ps(v)
#define VSUM4(a, b, c, d, out) sum4_512((a), (b), (c), (d), (out))
#define ROWS_FN rows_avx512_impl
#define MB_MAX 4
#define NB_MAX 6
#define NB1_MAX 4
#define FMA_LOOP_FN fma_loop_avx512_impl
#include "kernel_blocks.inc"

}  // namespace

void rows_avx512(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
                 int64_t ldy, int64_t M, int64_t K, int64_t n0, int64_t n1) {
  rows_avx512_impl(x, ldx, w, ldw, y, ldy, M, K, n0, n1);
}

float fma_loop_avx512(int64_t iters) { return fma_loop_avx512_impl(iters); }

}  // namespace edgespec_native
