// The horizontal sum the AVX2 files share (kernel_avx2.cpp, kernel_q_avx2.cpp): lo + hi halves,
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

}  // namespace
}  // namespace edgespec_native
