// The ISA choice and the threaded driver of kernel.h's row functions.
#pragma once

#include <cstdint>
#include <string>

namespace edgespec_native {

// The ISA the kernels run: "avx512", "avx2" or "generic". Chosen once from the CPU, or from
// EDGESPEC_KERNEL_ISA when that names one the CPU supports.
std::string isa();

// Selects an ISA the CPU supports; returns false (and changes nothing) otherwise. For tests.
bool set_isa(const std::string& name);

// The ISAs this CPU supports, best first.
std::string supported_isas();

// Threads the kernels split N over.
int threads();

// Float multiply-adds per second that the pool's threads sustain together in the chosen ISA's
// FMA loop (independent chains, no memory traffic): the compute ceiling of every kernel here.
// The best of `rounds` runs of about 20 ms each. `all_threads` false: the calling thread alone
// (beside the other, this shows whether the threads' cores share FMA units at the moment).
double fma_peak(int rounds, bool all_threads = true);

// The same for the int8 form's vpdpbusd loop (int8 multiply-adds per second); 0 where the
// AVX-512 VNNI form does not run.
double q8_peak(int rounds, bool all_threads = true);

// y (M, N; row stride ldy) = x (M, K; row stride ldx) @ w (N, K; row stride ldw).T, N split
// over the pool's threads when the product is big enough to pay for waking them.
void small_matmul(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
                  int64_t ldy, int64_t M, int64_t N, int64_t K);

}  // namespace edgespec_native
