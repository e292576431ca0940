// expf_libm.h's vector expf, compiled with -mavx2 -mfma only (see kernel.h for why the ISA
// files include nothing else).
#include <immintrin.h>

#include <cstdint>

#include "expf_libm.h"

namespace edgespec_native {
namespace {

// 2^(i/32) as a double's bits, less i << 47 (the exponent the index adds back): glibc's
// __exp2f_data.tab.
alignas(64) const uint64_t kExp2Table[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

}  // namespace

namespace {

// e^(sign x) for 4 floats as glibc's expf gives it where |x| < 88 (expf_libm.h).
inline __m128 expf4(__m128 x, __m256d sign) {
  const __m256d inv_ln2_n = _mm256_set1_pd(0x1.71547652b82fep+5);  // 32 / ln 2
  const __m256d shift = _mm256_set1_pd(0x1.8p+52);  // adding it rounds to an integer
  // the cubic's coefficients, scaled by powers of 32 (exactly)
  const __m256d c0 = _mm256_set1_pd(0x1.c6af84b912394p-5 / 32768.0);
  const __m256d c1 = _mm256_set1_pd(0x1.ebfce50fac4f3p-3 / 1024.0);
  const __m256d c2 = _mm256_set1_pd(0x1.62e42ff0c52d6p-1 / 32.0);
  const __m256d one = _mm256_set1_pd(1.0);
  const __m256d xd = _mm256_mul_pd(_mm256_cvtps_pd(x), sign);  // exact
  // z = x 32 / ln 2 rounded to an integer k, and r = z - k, as glibc's FMA build computes them:
  // both fused with the product (this file is compiled with -ffp-contract=off, so nothing the
  // compiler fuses or not on its own changes a bit).
  __m256d kd = _mm256_fmadd_pd(inv_ln2_n, xd, shift);
  const __m256i ki = _mm256_castpd_si256(kd);
  kd = _mm256_sub_pd(kd, shift);
  const __m256d r = _mm256_fmsub_pd(inv_ln2_n, xd, kd);
  __m256i t = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(kExp2Table),
                                     _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
  t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
  const __m256d p = _mm256_fmadd_pd(c0, r, c1);
  __m256d q = _mm256_fmadd_pd(c2, r, one);
  q = _mm256_fmadd_pd(p, _mm256_mul_pd(r, r), q);
  return _mm256_cvtpd_ps(_mm256_mul_pd(q, _mm256_castsi256_pd(t)));
}

// Lanes whose |x| >= 88 (or NaN, infinity): the top 12 bits' exponent part at least 88's.
inline int large4(__m128 x) {
  const __m128i top = _mm_and_si128(_mm_srli_epi32(_mm_castps_si128(x), 20), _mm_set1_epi32(0x7ff));
  return _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(top, _mm_set1_epi32(0x42a))));
}

}  // namespace

void expf_avx2(const float* x, float* y, int64_t n, bool negate) {
  const __m256d sign = _mm256_set1_pd(negate ? -1.0 : 1.0);
  for (int64_t i = 0; i + 4 <= n; i += 4) _mm_storeu_ps(y + i, expf4(_mm_loadu_ps(x + i), sign));
}

bool silu_libm_avx2(const float* gate, const float* up, float* act, int64_t n) {
  const __m256d minus = _mm256_set1_pd(-1.0);
  const __m128 one = _mm_set1_ps(1.0f);
  int large = 0;
  for (int64_t i = 0; i + 4 <= n; i += 4) {
    const __m128 g = _mm_loadu_ps(gate + i);
    large |= large4(g);
    const __m128 e = expf4(g, minus);
    _mm_storeu_ps(act + i, _mm_mul_ps(_mm_div_ps(g, _mm_add_ps(one, e)), _mm_loadu_ps(up + i)));
  }
  return large != 0;
}

}  // namespace edgespec_native
