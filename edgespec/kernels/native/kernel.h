// Small-M float32 products y = x @ w.T that read each weight row once for all rows of x.
//
// Contract (every ISA): y[m*ldy + n] = sum_k x[m*ldx + k] * w[n*ldw + k] for 0 <= m < M and
// n0 <= n < n1. Each output is summed in the same order whatever M is and wherever its row
// falls in a block, so a row's result does not depend on how many rows came with it (a
// verified token gets the bits it would get alone). Different ISAs sum in different orders.
//
// The ISA files (kernel_avx512.cpp, kernel_avx2.cpp) are compiled with their own -m flags and
// include nothing but intrinsics (and, for AVX2, avx2_sum.h, whose one function has internal
// linkage), so no inline function compiled for a wider ISA can be merged into code that runs
// on a narrower CPU.
#pragma once

#include <cstdint>

namespace edgespec_native {

using RowsFn = void (*)(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
                        int64_t ldy, int64_t M, int64_t K, int64_t n0, int64_t n1);

void rows_generic(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                  int64_t, int64_t, int64_t);
#if defined(__x86_64__) || defined(_M_X64)
void rows_avx2(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t,
               int64_t, int64_t, int64_t);
void rows_avx512(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                 int64_t, int64_t, int64_t);
float fma_loop_avx512(int64_t iters);  // 12 chains x iters FMAs; returns their sum
float fma_loop_avx2(int64_t iters);
#endif

// Threads split N on multiples of this many weight rows.
constexpr int64_t kRowsPerBlock = 48;  // a multiple of every ISA's NB_MAX and NB1_MAX (6, 3, 4, 4)

}  // namespace edgespec_native
