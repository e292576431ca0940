// AVX2 + FMA form of kernel_q.h's contract (compiled with -mavx2 -mfma only; see kernel.h for
// why the ISA files include nothing else). Eight values a step: 4 rows of x against 2 packed
// rows of w keep 8 accumulators, 2 dequantized weight vectors, 2 scales and 2 biases in the
// 16 ymm registers.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace edgespec_native {
namespace {

// 8 quantized values starting at value k (k a multiple of 8) of a packed row, as floats.
template <int BITS>
inline __m256 unpack8(const uint8_t* row, int64_t k) {
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

// MB rows of x against NB rows of w: w dequantized 8 values at a time (scale * q + bias, as
// mx.dequantize does), then the dot products; each output's order is fixed whatever M is.
template <int BITS, int MB, int NB>
inline void qblock(const float* x, int64_t ldx, const uint8_t* wq, int64_t ldq, const float* s,
                   const float* b, int64_t ldg, float* y, int64_t ldy, int64_t K, int64_t gs) {
  __m256 acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t g = 0, k0 = 0; k0 < K; ++g, k0 += gs) {
    __m256 sv[NB], bv[NB];
    for (int j = 0; j < NB; ++j) {
      sv[j] = _mm256_set1_ps(s[j * ldg + g]);
      bv[j] = _mm256_set1_ps(b[j * ldg + g]);
    }
    for (int64_t k = k0; k < k0 + gs; k += 8) {
      __m256 wv[NB];
      for (int j = 0; j < NB; ++j)
        wv[j] = _mm256_fmadd_ps(unpack8<BITS>(wq + j * ldq, k), sv[j], bv[j]);
      for (int i = 0; i < MB; ++i) {
        const __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
        for (int j = 0; j < NB; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) y[i * ldy + j] = sum8(acc[i][j]);
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
  for (; n + 2 <= n1; n += 2)
    qcolumns<BITS, 2>(x, ldx, wq + n * ldq, ldq, s + n * ldg, b + n * ldg, ldg, y + n, ldy, M, K, gs);
  for (; n < n1; ++n)
    qcolumns<BITS, 1>(x, ldx, wq + n * ldq, ldq, s + n * ldg, b + n * ldg, ldg, y + n, ldy, M, K, gs);
}

}  // namespace

void qrows_avx2(int bits, const float* x, int64_t ldx, const uint8_t* wq, int64_t ldq,
                const float* s, const float* b, int64_t ldg, float* y, int64_t ldy, int64_t M,
                int64_t K, int64_t gs, int64_t n0, int64_t n1) {
  if (bits == 8) return qrows<8>(x, ldx, wq, ldq, s, b, ldg, y, ldy, M, K, gs, n0, n1);
  qrows<4>(x, ldx, wq, ldq, s, b, ldg, y, ldy, M, K, gs, n0, n1);
}

}  // namespace edgespec_native
