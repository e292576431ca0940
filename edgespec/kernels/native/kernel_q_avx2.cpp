// AVX2 + FMA form of kernel_q.h's contract (compiled with -mavx2 -mfma only; see kernel.h for
// why the ISA files include nothing else): 8 values a vector, blocks of 4 rows x 2 columns (1
// row x 4 columns for a single row of x).
//
// 4 bits: 16 packed bytes (32 values) give their low nibbles (the even values; a mask) and then
// their high nibbles (the odd values; a shift and a mask), 8 at a time widened, converted and
// fma(q, scale, bias)'d: x comes de-interleaved (kernel_q.h). Dequantized into the fused
// products in one go per column (Deq<4>::whole: 4 weight vectors live; chosen over the two
// parts of `step`, which the buffered and float-kernel paths use, at 1-8 rows).
// 8 bits: widen, convert, fma(q, scale, bias) per 8 values.
#include <immintrin.h>

#include <cstdint>

#include "avx2_sum.h"

namespace edgespec_native {
namespace {

inline __m256 deq_lanes(__m256i q, __m256 s, __m256 b) {  // fma(q, scale, bias), q in 32-bit lanes
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), s, b);
}

inline __m256 deq8(__m128i bytes, __m256 s, __m256 b) {  // the low 8 bytes
  return deq_lanes(_mm256_cvtepu8_epi32(bytes), s, b);
}

template <int BITS>
struct Deq;

struct GroupScale {  // one group's scale and bias, in every lane
  __m256 s, b;
  GroupScale() = default;
  GroupScale(float s_, float b_) : s(_mm256_set1_ps(s_)), b(_mm256_set1_ps(b_)) {}
};

template <>
struct Deq<4> : GroupScale {
  using GroupScale::GroupScale;
  // part 0: the low nibbles of 16 packed bytes (the even values), part 1: the high ones.
  inline void step(const uint8_t* row, int64_t k, int part, __m256* w) const {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2));
    if (part) v = _mm_srli_epi16(v, 4);
    v = _mm_and_si128(v, _mm_set1_epi8(15));
    w[0] = deq8(v, s, b);
    w[1] = deq8(_mm_unpackhi_epi64(v, v), s, b);
  }
  // Both parts at once (DEQ_WHOLE; kernel_q_blocks.inc's qblock): each 8 packed bytes widened
  // straight from memory to 32-bit lanes, whose low nibbles (a mask) and high ones (a shift)
  // give part 0's and part 1's vectors, the same values in step's order; fewer operations
  // than two steps (no 16-byte mask and shift, no unpack of the high half).
  inline void whole(const uint8_t* row, int64_t k, __m256* w) const {
    const uint8_t* p = row + k / 2;  // bytes 0-7 and 8-15, one byte a 32-bit lane
    const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i c =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
    const __m256i m = _mm256_set1_epi32(15);
    w[0] = deq_lanes(_mm256_and_si256(a, m), s, b);  // part 0: the low nibbles
    w[1] = deq_lanes(_mm256_and_si256(c, m), s, b);
    w[2] = deq_lanes(_mm256_srli_epi32(a, 4), s, b);  // part 1: the high nibbles
    w[3] = deq_lanes(_mm256_srli_epi32(c, 4), s, b);
  }
};

template <>
struct Deq<8> : GroupScale {
  using GroupScale::GroupScale;
  inline void step(const uint8_t* row, int64_t k, int part, __m256* w) const {
    const uint8_t* p = row + k + 16 * part;  // each 8 bytes widened straight from memory
    w[0] = deq8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), s, b);
    w[1] = deq8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)), s, b);
  }
};

#define VEC __m256
#define LANES 8
#define VZERO() _mm256_setzero_ps()
#define VSTORE(p, v) _mm256_store_ps((p), (v))
#define VLOAD(p) _mm256_loadu_ps(p)
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VSUM(v) sum256(v)
#define VSUM4(a, b, c, d, out) sum4_256((a), (b), (c), (d), (out))
#define NB1_MAX 4
#define QAHEAD1 1
#define NB_MAX 2
#define PARTS 2
#define DEQ_WHOLE
#define QROWS_FN qrows_avx2_impl
#define QDEQ_FN qdequantize_avx2_impl
#include "kernel_q_blocks.inc"

}  // namespace

void qrows_avx2(int bits, const float* x, int64_t ldx, const uint8_t* wq, int64_t ldq,
                const float* s, const float* b, int64_t ldg, float* y, int64_t ldy, int64_t M,
                int64_t K, int64_t gs, int64_t n0, int64_t n1, float* buf) {
  qrows_avx2_impl(bits, x, ldx, wq, ldq, s, b, ldg, y, ldy, M, K, gs, n0, n1, buf);
}

void qdequantize_avx2(int bits, const uint8_t* wq, int64_t ldq, const float* s, const float* b,
                      int64_t ldg, int64_t K, int64_t gs, int64_t n0, int64_t n1, float* out,
                      int64_t ldo) {
  qdequantize_avx2_impl(bits, wq, ldq, s, b, ldg, K, gs, n0, n1, out, ldo);
}

}  // namespace edgespec_native
