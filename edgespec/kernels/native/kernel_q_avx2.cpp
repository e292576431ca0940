// AVX2 + FMA form of kernel_q.h's contract (compiled with -mavx2 -mfma only; see kernel.h for
// why the ISA files include nothing else): 8 values a step, blocks of 4 rows x 2 columns (8
// accumulators, 2 weight vectors, 2 scales, 2 biases and x in the 16 ymm registers).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace edgespec_native {
namespace {

// 8 quantized values starting at value k (k a multiple of 8) of a packed row, as floats.
template <int BITS>
inline __m256 unpack(const uint8_t* row, int64_t k) {
  if constexpr (BITS == 8) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
        reinterpret_cast<const __m128i*>(row + k))));
  } else {  // 4 bits: value j is nibble j % 2 (low first) of byte j / 2
    int32_t four;
    std::memcpy(&four, row + k / 2, 4);
    const __m128i bytes = _mm_cvtsi32_si128(four);
    const __m256i both = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, bytes));
    const __m256i shift = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    const __m256i v = _mm256_and_si256(_mm256_srlv_epi32(both, shift), _mm256_set1_epi32(15));
    return _mm256_cvtepi32_ps(v);
  }
}

inline float sum8(__m256 v) {  // (lo + hi), then pairs: a fixed order
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#define VEC __m256
#define LANES 8
#define VZERO() _mm256_setzero_ps()
#define VSET1(s) _mm256_set1_ps(s)
#define VLOAD(p) _mm256_loadu_ps(p)
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VSUM(v) sum8(v)
#define NB_MAX 2
#define QROWS_FN qrows_avx2_impl
#include "kernel_q_blocks.inc"

}  // namespace

void qrows_avx2(int bits, const float* x, int64_t ldx, const uint8_t* wq, int64_t ldq,
                const float* s, const float* b, int64_t ldg, float* y, int64_t ldy, int64_t M,
                int64_t K, int64_t gs, int64_t n0, int64_t n1) {
  qrows_avx2_impl(bits, x, ldx, wq, ldq, s, b, ldg, y, ldy, M, K, gs, n0, n1);
}

}  // namespace edgespec_native
