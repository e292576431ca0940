// The opt-in int8-activation form of kernel_q.h's product (EDGESPEC_Q8_ACTIVATIONS=1),
// compiled with -mavx512f -mavx512bw -mavx512vnni -mfma only (see kernel.h for why the ISA
// files include nothing else). x comes quantized per 32-value block (quantized_matmul.cpp's
// quantize_x8): int8 q with a float scale d, x ~ d * q. 4 bits, per 128 values (4 blocks, 64
// packed bytes) and weight row: one mask and one shift + mask give the values as bytes (low
// nibbles: even values, high: odd), and two vpdpbusd (u8 x s8 -> int32, exact) against the
// even / odd int8 values of x give 16 int32 lanes, 4 per block. 8 bits, per 64 values: the
// bytes go straight into one vpdpbusd, 8 lanes per block. Each lane is then scaled by its
// group's scale times its block's d. The bias part, sum_g bias_g * sum_(k in g) d q_k, is
// a short float dot over the groups at the end. Each output's order is fixed whatever M is.
#include <immintrin.h>

#include <cstdint>

namespace edgespec_native {
namespace {

template <int BITS, int MB, int NB>
inline void q8block(const int8_t* xe, const int8_t* xo, int64_t ldxq, const float* dl,
                    int64_t ldd, const float* xs, int64_t ldxs, const uint8_t* wq, int64_t ldq,
                    const float* s, const float* b, int64_t ldg, float* y, int64_t ldy,
                    int64_t K, int64_t gs) {
  constexpr int64_t kStep = BITS == 4 ? 128 : 64;  // values a step: 64 packed bytes
  constexpr int kLaneVals = BITS == 4 ? 8 : 4;      // values of x a lane's dot covers
  // lane l's group in a step, relative to the step's first group
  const int shift = (gs == 32 ? 5 : gs == 64 ? 6 : 7) - (BITS == 4 ? 3 : 2);
  const __m512i idx = _mm512_srli_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), shift);
  const __m512i m4 = _mm512_set1_epi8(15);
  const int64_t G = K / gs, gpc = (kStep + gs - 1) / gs;
  __m512 acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += kStep) {
    const int64_t nbytes = K - k >= kStep ? 64 : (K - k) * BITS / 8, g0 = k / gs;
    const __mmask64 wmask = nbytes == 64 ? ~__mmask64(0) : (__mmask64(1) << nbytes) - 1;
    const __mmask16 gmask = __mmask16((1u << (G - g0 < gpc ? G - g0 : gpc)) - 1u);
    for (int j = 0; j < NB; ++j) {
      const __m512i v = _mm512_maskz_loadu_epi8(wmask, wq + j * ldq + k * BITS / 8);
      const __m512 sv = _mm512_permutexvar_ps(idx, _mm512_maskz_loadu_ps(gmask, s + j * ldg + g0));
      __m512i lo = v, hi = v;
      if constexpr (BITS == 4) {
        lo = _mm512_and_si512(v, m4);
        hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      }
      for (int i = 0; i < MB; ++i) {
        __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo,
                                          _mm512_loadu_si512(xe + i * ldxq + k * BITS / 8));
        if constexpr (BITS == 4)
          dot = _mm512_dpbusd_epi32(dot, hi, _mm512_loadu_si512(xo + i * ldxq + k / 2));
        const __m512 sd = _mm512_mul_ps(sv, _mm512_loadu_ps(dl + i * ldd + k / kLaneVals));
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sd, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) {
      __m512 bacc = _mm512_setzero_ps();
      for (int64_t g = 0; g < G; g += 16) {
        const __mmask16 m = __mmask16(G - g >= 16 ? 0xffffu : (1u << (G - g)) - 1u);
        bacc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, b + j * ldg + g),
                               _mm512_maskz_loadu_ps(m, xs + i * ldxs + g), bacc);
      }
      y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]) + _mm512_reduce_add_ps(bacc);
    }
}

template <int BITS, int NB>
inline void q8columns(const int8_t* xe, const int8_t* xo, int64_t ldxq, const float* dl,
                      int64_t ldd, const float* xs, int64_t ldxs, const uint8_t* wq, int64_t ldq,
                      const float* s, const float* b, int64_t ldg, float* y, int64_t ldy,
                      int64_t M, int64_t K, int64_t gs) {
#define Q8ROWS(MB, m)                                                                 \
  q8block<BITS, MB, NB>(xe + (m) * ldxq, xo + (m) * ldxq, ldxq, dl + (m) * ldd, ldd,   \
                        xs + (m) * ldxs, ldxs, wq, ldq, s, b, ldg, y + (m) * ldy, ldy, K, gs)
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) Q8ROWS(4, m);
  switch (M - m) {
    case 3: Q8ROWS(3, m); break;
    case 2: Q8ROWS(2, m); break;
    case 1: Q8ROWS(1, m); break;
    default: break;
  }
#undef Q8ROWS
}

template <int BITS>
void q8rows(const int8_t* xe, const int8_t* xo, int64_t ldxq, const float* dl, int64_t ldd,
            const float* xs, int64_t ldxs, const uint8_t* wq, int64_t ldq, const float* s,
            const float* b, int64_t ldg, float* y, int64_t ldy, int64_t M, int64_t K, int64_t gs,
            int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4)
    q8columns<BITS, 4>(xe, xo, ldxq, dl, ldd, xs, ldxs, wq + n * ldq, ldq, s + n * ldg,
                       b + n * ldg, ldg, y + n, ldy, M, K, gs);
  for (; n < n1; ++n)
    q8columns<BITS, 1>(xe, xo, ldxq, dl, ldd, xs, ldxs, wq + n * ldq, ldq, s + n * ldg,
                       b + n * ldg, ldg, y + n, ldy, M, K, gs);
}

}  // namespace

void q8rows_avx512vnni(int bits, const int8_t* xe, const int8_t* xo, int64_t ldxq,
                       const float* dl, int64_t ldd, const float* xs, int64_t ldxs,
                       const uint8_t* wq, int64_t ldq, const float* s, const float* b,
                       int64_t ldg, float* y, int64_t ldy, int64_t M, int64_t K, int64_t gs, int64_t n0, int64_t n1) {
  if (bits == 8)
    return q8rows<8>(xe, xo, ldxq, dl, ldd, xs, ldxs, wq, ldq, s, b, ldg, y, ldy, M, K, gs, n0, n1);
  q8rows<4>(xe, xo, ldxq, dl, ldd, xs, ldxs, wq, ldq, s, b, ldg, y, ldy, M, K, gs, n0, n1);
}

}  // namespace edgespec_native
