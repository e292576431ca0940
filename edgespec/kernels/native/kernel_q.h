// Small-M products with group-quantized weights in MLX's affine layout (mx.quantize):
// y = x @ dequantize(wq, scales, biases).T, where row n of w is packed into uint32 words (bits =
// 4: 8 values a word, 8: 4 a word, value j in bits [j*bits, (j+1)*bits), low first) and value
// k of row n dequantizes to scales[n, k / gs] * q + biases[n, k / gs].
//
// Contract (every ISA): rows n0 <= n < n1 of y (M, ldy) from x (M, ldx), the packed rows wq
// (row stride ldq bytes) and scales/biases (row stride ldg). K is a multiple of gs, gs of 16.
// As in kernel.h, each output is summed in one order whatever M is.
// For bits = 4 the AVX-512 and AVX2 forms take x de-interleaved per 32-value block (values
// 0, 2, .., 30 then 1, 3, .., 31: the low nibbles, then the high nibbles of 16 packed bytes;
// quantized_matmul.cpp's deinterleave32); the generic form takes x as it is.
#pragma once

#include <cstdint>

namespace edgespec_native {

void qrows_generic(int bits, const float* x, int64_t ldx, const uint8_t* wq, int64_t ldq,
                   const float* s, const float* b, int64_t ldg, float* y, int64_t ldy, int64_t M,
                   int64_t K, int64_t gs, int64_t n0, int64_t n1);
#if defined(__x86_64__) || defined(_M_X64)
// buf: nullptr, or scratch of at least 4 * K floats (64-byte aligned) in which, for M > 4, each
// block of 4 packed rows is dequantized once for all rows of x (the same bits; see
// kernel_q_blocks.inc).
void qrows_avx512(int bits, const float* x, int64_t ldx, const uint8_t* wq, int64_t ldq,
                  const float* s, const float* b, int64_t ldg, float* y, int64_t ldy, int64_t M,
                  int64_t K, int64_t gs, int64_t n0, int64_t n1, float* buf);
void qrows_avx2(int bits, const float* x, int64_t ldx, const uint8_t* wq, int64_t ldq,
                const float* s, const float* b, int64_t ldg, float* y, int64_t ldy, int64_t M,
                int64_t K, int64_t gs, int64_t n0, int64_t n1, float* buf);
// Rows n0 <= n < n1 of the dequantized weights, scale * q + bias rounded once as qrows computes
// them, into out (row n - n0 at out + (n - n0) * ldo; 64-byte aligned, ldo a multiple of 16)
// in the order kernel_q.h gives x (de-interleaved for 4 bits).
void qdequantize_avx512(int bits, const uint8_t* wq, int64_t ldq, const float* s, const float* b,
                        int64_t ldg, int64_t K, int64_t gs, int64_t n0, int64_t n1, float* out,
                        int64_t ldo);
void qdequantize_avx2(int bits, const uint8_t* wq, int64_t ldq, const float* s, const float* b,
                      int64_t ldg, int64_t K, int64_t gs, int64_t n0, int64_t n1, float* out,
                      int64_t ldo);
// The opt-in int8-activation form (AVX-512 VNNI; kernel_q8_avx512.cpp), x quantized per
// 32-value block to int8 q with scale d. 4 bits: xe / xo (M rows of Kp/2 int8, row stride
// ldxq; Kp = K rounded up to 128, zeros past K) hold q at even / odd positions; dl (M, ldd >=
// Kp/8): each block's d once per 8 values (4 times). 8 bits: xe holds q in order (Kp = K
// rounded up to 64), xo is unused, dl has d once per 4 values (8 times). Both: xs (M, ldxs >=
// K/gs) the per-group sums of d * q.
void q8rows_avx512vnni(int bits, const int8_t* xe, const int8_t* xo, int64_t ldxq, const float* dl,
                       int64_t ldd, const float* xs, int64_t ldxs, const uint8_t* wq,
                       int64_t ldq, const float* s, const float* b, int64_t ldg, float* y,
                       int64_t ldy, int64_t M, int64_t K, int64_t gs, int64_t n0, int64_t n1);
#endif

}  // namespace edgespec_native
