// The horizontal sums the AVX2 files share (kernel_avx2.cpp, kernel_q_avx2.cpp): lo + hi halves,
// then pairs, a fixed order. Include it only from files compiled with -mavx2; it has internal
// linkage, so no copy of it can be merged into code that runs on another ISA (see kernel.h).
#pragma once

#include <immintrin.h>

namespace edgespec_native {
namespace {

inline float sum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// out[0..3] = the sums of a, b, c, d, each in sum256's order: four vectors share each shuffle
// and add.
inline void sum4_256(__m256 a, __m256 b, __m256 c, __m256 d, float* out) {
  // [a's 4 | b's 4]: lo + hi
  const __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  const __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
  // [a0+a2, a1+a3, c0+c2, c1+c3 | the same for b, d]: the pairs
  const __m256 p = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x44), _mm256_shuffle_ps(ab, cd, 0xEE));
  const __m256 s = _mm256_hadd_ps(p, p);  // [a, c, a, c | b, d, b, d]
  _mm_storeu_ps(out, _mm256_castps256_ps128(_mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0))));
}

}  // namespace
}  // namespace edgespec_native
