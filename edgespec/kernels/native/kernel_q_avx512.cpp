// AVX-512F form of kernel_q.h's contract (compiled with -mavx512f -mfma only; see kernel.h for
// why the ISA files include nothing else).
#include <immintrin.h>

#include <cstdint>

namespace edgespec_native {
namespace {

// 16 quantized values starting at value k (k a multiple of 16) of a packed row, as floats.
template <int BITS>
inline __m512 unpack16(const uint8_t* row, int64_t k) {
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

// MB rows of x against NB rows of w: w dequantized 16 values at a time (scale * q + bias, as
// mx.dequantize does), then the float kernel's dot products.
template <int BITS, int MB, int NB>
inline void qblock(const float* x, int64_t ldx, const uint8_t* wq, int64_t ldq, const float* s,
                   const float* b, int64_t ldg, float* y, int64_t ldy, int64_t K, int64_t gs) {
  __m512 acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t g = 0, k0 = 0; k0 < K; ++g, k0 += gs) {
    __m512 sv[NB], bv[NB];
    for (int j = 0; j < NB; ++j) {
      sv[j] = _mm512_set1_ps(s[j * ldg + g]);
      bv[j] = _mm512_set1_ps(b[j * ldg + g]);
    }
    for (int64_t k = k0; k < k0 + gs; k += 16) {
      __m512 wv[NB];
      for (int j = 0; j < NB; ++j)
        wv[j] = _mm512_fmadd_ps(unpack16<BITS>(wq + j * ldq, k), sv[j], bv[j]);
      for (int i = 0; i < MB; ++i) {
        const __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
        for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]);
}

template <int BITS, int NB>
inline void qcolumns(const float* x, int64_t ldx, const uint8_t* wq, int64_t ldq, const float* s,
                     const float* b, int64_t ldg, float* y, int64_t ldy, int64_t M, int64_t K,
                     int64_t gs) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    qblock<BITS, 4, NB>(x + m * ldx, ldx, wq, ldq, s, b, ldg, y + m * ldy, ldy, K, gs);
  switch (M - m) {
    case 3: qblock<BITS, 3, NB>(x + m * ldx, ldx, wq, ldq, s, b, ldg, y + m * ldy, ldy, K, gs); break;
    case 2: qblock<BITS, 2, NB>(x + m * ldx, ldx, wq, ldq, s, b, ldg, y + m * ldy, ldy, K, gs); break;
    case 1: qblock<BITS, 1, NB>(x + m * ldx, ldx, wq, ldq, s, b, ldg, y + m * ldy, ldy, K, gs); break;
    default: break;
  }
}

template <int BITS>
void qrows(const float* x, int64_t ldx, const uint8_t* wq, int64_t ldq, const float* s,
           const float* b, int64_t ldg, float* y, int64_t ldy, int64_t M, int64_t K, int64_t gs,
           int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4)
    qcolumns<BITS, 4>(x, ldx, wq + n * ldq, ldq, s + n * ldg, b + n * ldg, ldg, y + n, ldy, M, K, gs);
  for (; n < n1; ++n)
    qcolumns<BITS, 1>(x, ldx, wq + n * ldq, ldq, s + n * ldg, b + n * ldg, ldg, y + n, ldy, M, K, gs);
}

}  // namespace

void qrows_avx512(int bits, const float* x, int64_t ldx, const uint8_t* wq, int64_t ldq,
                  const float* s, const float* b, int64_t ldg, float* y, int64_t ldy, int64_t M,
                  int64_t K, int64_t gs, int64_t n0, int64_t n1) {
  if (bits == 8) return qrows<8>(x, ldx, wq, ldq, s, b, ldg, y, ldy, M, K, gs, n0, n1);
  qrows<4>(x, ldx, wq, ldq, s, b, ldg, y, ldy, M, K, gs, n0, n1);
}

}  // namespace edgespec_native
