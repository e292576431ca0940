// Horizontal sums the AVX-512 files share (kernel_avx512.cpp, kernel_q_avx512.cpp). Include it
// only from files compiled with -mavx512f; it has internal linkage, so no copy of it can be
// merged into code that runs on another ISA (see kernel.h).
#pragma once

#include <immintrin.h>

namespace edgespec_native {
namespace {

// out[0..3] = the sums of a, b, c, d, each added in _mm512_reduce_add_ps's order (lanes l and
// l+8, then l and l+4, l and l+2, the last two), so an output's bits are those of a sum on its
// own; four vectors share each shuffle and add (faster than four sums apart: docs/measurements.md,
// "the kernels' remaining slack").
inline void sum4_512(__m512 a, __m512 b, __m512 c, __m512 d, float* out) {
  // [a's 8 | b's 8]: l + l+8
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  // block r holds vector r's 4: l + l+4
  const __m512 s4 = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  const __m512 s2 = _mm512_add_ps(s4, _mm512_permute_ps(s4, 0x4E));  // l + l+2
  const __m512 s1 = _mm512_add_ps(s2, _mm512_permute_ps(s2, 0xB1));  // the last two: lane 4r
  const __m512i lanes = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_permutexvar_ps(lanes, s1)));
}

}  // namespace
}  // namespace edgespec_native
