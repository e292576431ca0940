// AVX2 + FMA form of kernel_q.h's contract (compiled with -mavx2 -mfma only; see kernel.h for
// why the ISA files include nothing else): 8 values a vector, blocks of 4 rows x 2 columns.
//
// 4 bits: 16 packed bytes (32 values) are split once into their low nibbles (the even values)
// and high nibbles (the odd values) with a mask and a shift + mask on 16 bytes, then each half
// of each is widened, converted and fma(q, scale, bias)'d: x comes de-interleaved (kernel_q.h).
// 8 bits: widen, convert, fma(q, scale, bias) per 8 values.
#include <immintrin.h>

#include <cstdint>

namespace edgespec_native {
namespace {

inline __m256 deq8(__m128i bytes, __m256 s, __m256 b) {  // the low 8 bytes
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), s, b);
}

template <int BITS>
struct Deq;

template <>
struct Deq<4> {
  __m256 s, b;
  Deq() = default;
  Deq(float s_, float b_) : s(_mm256_set1_ps(s_)), b(_mm256_set1_ps(b_)) {}
  inline void step(const uint8_t* row, int64_t k, __m256* w) const {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2));
    const __m128i m = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    w[0] = deq8(lo, s, b);
    w[1] = deq8(_mm_unpackhi_epi64(lo, lo), s, b);
    w[2] = deq8(hi, s, b);
    w[3] = deq8(_mm_unpackhi_epi64(hi, hi), s, b);
  }
};

template <>
struct Deq<8> {
  __m256 s, b;
  Deq() = default;
  Deq(float s_, float b_) : s(_mm256_set1_ps(s_)), b(_mm256_set1_ps(b_)) {}
  inline void step(const uint8_t* row, int64_t k, __m256* w) const {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k + 16));
    w[0] = deq8(lo, s, b);
    w[1] = deq8(_mm_unpackhi_epi64(lo, lo), s, b);
    w[2] = deq8(hi, s, b);
    w[3] = deq8(_mm_unpackhi_epi64(hi, hi), s, b);
  }
};

inline float sum8(__m256 v) {  // (lo + hi), then pairs: a fixed order
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#define VEC __m256
#define LANES 8
#define VZERO() _mm256_setzero_ps()
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
