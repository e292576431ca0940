// AVX-512F form of kernel_q.h's contract (compiled with -mavx512f -mfma only; see kernel.h for
// why the ISA files include nothing else): 16 values a vector, blocks of 4 rows x 4 columns.
//
// 4 bits: each group's 16 possible weights fma(q, scale, bias), q = 0..15, are computed once
// into a register (the table), and 16 packed bytes (32 values) become two vectors of weights
// with one zero-extension to 32-bit lanes, one shift and two vpermps lookups (vpermps reads
// only an index's low 4 bits: the low nibble needs no mask). The low nibbles are the even
// values, the high ones the odd values: x comes de-interleaved (kernel_q.h). 4 instructions per
// 32 weights instead of 14 (load, unpack, widen, shift, mask, convert, fma per 16).
// 8 bits: widen, convert, fma(q, scale, bias) per 16 values.
#include <immintrin.h>

#include <cstdint>

#include "avx512_sum.h"

namespace edgespec_native {
namespace {

template <int BITS>
struct Deq;

template <>
struct Deq<4> {
  __m512 table;
  Deq() = default;
  Deq(float s, float b)
      : table(_mm512_fmadd_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                              _mm512_set1_ps(s), _mm512_set1_ps(b))) {}
  inline void step(const uint8_t* row, int64_t k, int, __m512* w) const {
    const __m512i v =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2)));
    w[0] = _mm512_permutexvar_ps(v, table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
  }
};

template <>
struct Deq<8> {
  __m512 s, b;
  Deq() = default;
  Deq(float s_, float b_) : s(_mm512_set1_ps(s_)), b(_mm512_set1_ps(b_)) {}
  inline void step(const uint8_t* row, int64_t k, int, __m512* w) const {
    for (int v = 0; v < 2; ++v)
      w[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                                 reinterpret_cast<const __m128i*>(row + k + 16 * v)))),
                             s, b);
  }
};

#define VEC __m512
#define LANES 16
#define VZERO() _mm512_setzero_ps()
#define VSTORE(p, v) _mm512_store_ps((p), (v))
#define VLOAD(p) _mm512_loadu_ps(p)
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VSUM(v) _mm512_reduce_add_ps(v)
#define VSUM4(a, b, c, d, out) sum4_512((a), (b), (c), (d), (out))
#define NB1_MAX 4
#define QAHEAD1 8  // as its other blocks (not chosen by a measurement of its own on AVX-512)
#define NB_MAX 4
#define PARTS 1
#define QROWS_FN qrows_avx512_impl
#define QDEQ_FN qdequantize_avx512_impl
#include "kernel_q_blocks.inc"

}  // namespace

void qrows_avx512(int bits, const float* x, int64_t ldx, const uint8_t* wq, int64_t ldq,
                  const float* s, const float* b, int64_t ldg, float* y, int64_t ldy, int64_t M,
                  int64_t K, int64_t gs, int64_t n0, int64_t n1, float* buf) {
  qrows_avx512_impl(bits, x, ldx, wq, ldq, s, b, ldg, y, ldy, M, K, gs, n0, n1, buf);
}

void qdequantize_avx512(int bits, const uint8_t* wq, int64_t ldq, const float* s, const float* b,
                        int64_t ldg, int64_t K, int64_t gs, int64_t n0, int64_t n1, float* out,
                        int64_t ldo) {
  qdequantize_avx512_impl(bits, wq, ldq, s, b, ldg, K, gs, n0, n1, out, ldo);
}

}  // namespace edgespec_native
