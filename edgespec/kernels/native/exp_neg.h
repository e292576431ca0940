// e^x for x <= 0, branch-free so that loops over it vectorize: the tree attention's softmax
// (attention_core.inc) and the decoder block's SiLU (block.cpp) share it. It has internal
// linkage, so every file, the ISA files included, compiles its own copy for its own flags and
// none can be merged into code that runs on another ISA (see kernel.h).
#pragma once

#include <cstdint>

namespace edgespec_native {
namespace {

// Relative error ~2e-7 near 0, up to ~4e-6 near -87 (from rounding x log2 e): 2^(x log2 e)
// split as 2^n * 2^f, |f| <= 1/2, 2^f by its Taylor series to degree 6. Below -87.3 it gives
// 2^-126 (~1e-38), which is 0 for a softmax weight's purposes; a caller that needs an exact 0
// there selects it.
inline float exp_neg(float x) {
  float t = x * 1.44269504088896341f;
  t = t < -126.0f ? -126.0f : t;
  const float n = __builtin_floorf(t + 0.5f);
  const float f = (t - n) * 0.693147180559945309f;
  const float p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 +
                                                 f * (1.0f / 120 + f * (1.0f / 720))))));
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  __builtin_memcpy(&two_n, &bits, 4);
  return p * two_n;
}

}  // namespace
}  // namespace edgespec_native
