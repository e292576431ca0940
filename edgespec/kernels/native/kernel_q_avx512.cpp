// AVX-512F form of kernel_q.h's contract (compiled with -mavx512f -mfma only; see kernel.h for
// why the ISA files include nothing else): 16 values a step, blocks of 4 rows x 4 columns.
#include <immintrin.h>

#include <cstdint>

namespace edgespec_native {
namespace {

// 16 quantized values starting at value k (k a multiple of 16) of a packed row, as floats.
template <int BITS>
inline __m512 unpack(const uint8_t* row, int64_t k) {
  if constexpr (BITS == 8) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(row + k))));
  } else {  // 4 bits: value j is nibble j % 2 (low first) of byte j / 2
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k / 2));
    const __m512i both = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, bytes));
    const __m512i shift = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
    const __m512i v = _mm512_and_si512(_mm512_srlv_epi32(both, shift), _mm512_set1_epi32(15));
    return _mm512_cvtepi32_ps(v);
  }
}

#define VEC __m512
#define LANES 16
#define VZERO() _mm512_setzero_ps()
#define VSET1(s) _mm512_set1_ps(s)
#define VLOAD(p) _mm512_loadu_ps(p)
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VSUM(v) _mm512_reduce_add_ps(v)
#define NB_MAX 4
#define QROWS_FN qrows_avx512_impl
#include "kernel_q_blocks.inc"

}  // namespace

void qrows_avx512(int bits, const float* x, int64_t ldx, const uint8_t* wq, int64_t ldq,
                  const float* s, const float* b, int64_t ldg, float* y, int64_t ldy, int64_t M,
                  int64_t K, int64_t gs, int64_t n0, int64_t n1) {
  qrows_avx512_impl(bits, x, ldx, wq, ldq, s, b, ldg, y, ldy, M, K, gs, n0, n1);
}

}  // namespace edgespec_native
