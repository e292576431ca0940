// e^x with the C library's own bits, many values at a time: the SiLU of the int8-activation
// forward (block.cpp), whose down_proj rounds every value to 8 bits, so that one ulp of exp
// flips roundings against the twin, which takes libm's exp.
//
// glibc's expf (the Arm optimized-routines algorithm: x / ln 2 in double, a 32-entry table of
// 2^(i/32), a cubic in double, one rounding to float) done 4 lanes at a time with AVX2 and FMA
// in expf_avx2.cpp. Its bits equal glibc's for every float below 88 in magnitude (checked for
// all 2^32 inputs on x86-64 glibc); a larger one or a NaN takes std::exp itself. Another libm
// (or a later glibc) could round differently, so block.cpp checks a spread of inputs against
// std::exp once and keeps the scalar loop if any differs.
#pragma once

#include <cstdint>

namespace edgespec_native {

#if defined(__x86_64__) || defined(_M_X64)
// y[i] = e^(sign x[i]) (sign -1 when negate) for i < n - n % 4, as glibc's expf gives it for
// |x[i]| < 88; other lanes hold anything (expf_avx2.cpp).
void expf_avx2(const float* x, float* y, int64_t n, bool negate);
// act[i] = gate[i] / (1 + e^-gate[i]) * up[i] for i < n - n % 4, that exp expf_avx2's, the
// float operations each one IEEE operation as the scalar expression does them. Returns whether
// any of those gates is 88 or more in magnitude (or NaN, infinite): their lanes hold anything.
bool silu_libm_avx2(const float* gate, const float* up, float* act, int64_t n);
#endif

// y[i] = std::exp(-x[i]) for i < n, bit for bit, through expf_avx2 where the CPU has AVX2
// and FMA and the check above passed (block.cpp).
void exp_neg_libm(const float* x, float* y, int64_t n);

// act[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i] for i < n, bit for bit, through
// silu_libm_avx2 where exp_neg_libm takes the vector path (block.cpp).
void silu_libm(const float* gate, const float* up, float* act, int64_t n);

// Whether exp_neg_libm and silu_libm take the vector path on this machine.
bool expf_vector_active();

}  // namespace edgespec_native
