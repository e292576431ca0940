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
// The int8-activation forms (kernel_q8_avx512.cpp: AVX-512 VNNI; kernel_q8_avx2.cpp: AVX2, the
// same bits). x comes quantized per 32-value block b to int8 q with scale d (x ~ d * q), in
// steps of 128 values (4 blocks; K rounded up to 128, zeros past K) of 8 rounds, round e's
// dword b holding 4 values of block b: for 4 bits the even values 8e..8e+6 of the block
// (e < 4) or the odd ones 8(e-4)+1..8(e-4)+7, for 8 bits the values 4e..4e+3; per step, xd
// holds d of each block and xs d * sum(q) of each block. The AVX2 form takes it per row (xr:
// row stride ldr bytes, a step 128 bytes, a round 16; xd, xs: row stride ldf floats, a step
// 4). The VNNI form takes it per row in the lane layout (xr: row stride ldr bytes, a step two
// 64-byte vectors, vector h's dword 4b + e holding round 4h + e of block b; xd: row stride ldf
// floats, a step 32 floats, lanes 4b..4b + 3 holding block b's d, then 16 more its
// d * sum(q); xs unread). An output is the sum over steps, in order, of
// int_dot * (scale * d) + bias * xs per block (one FMA each), kept per block, then
// (b0 + b2) + (b1 + b3). The VNNI form takes b null for a
// symmetric format (every bias -2^(bits - 1) times its scale) and makes the biases from the
// scales: the same values, so the same bits, without reading them. s and b are float32, or
// float16 where half (widened exactly as they are read: the same bits as their float32
// values; a step then reads half the scale bytes, a third of a 4-bit product's traffic).
// The AVX2 form needs F16C (q8_form: every AVX2 CPU has it).
// From this many rows on, the VNNI form takes columns in blocks of 16 in column lanes
// (kernel_q8_avx512.cpp's wide form: the same bits); threads split N on multiples of 16 there.
// Below it the per-call transposition of the weights costs more than the rows save
// (docs/measurements.md, "Prefill products in column lanes").
constexpr int64_t kQ8WideRows = 9;
void q8rows_avx512vnni(int bits, const int8_t* xr, int64_t ldr, const float* xd, const float* xs,
                       int64_t ldf, const uint8_t* wq, int64_t ldq, const void* s,
                       const void* b, bool half, int64_t ldg, float* y, int64_t ldy, int64_t M,
                       int64_t K, int64_t gs, int64_t n0, int64_t n1);
void q8rows_avx2(int bits, const int8_t* xr, int64_t ldr, const float* xd, const float* xs,
                 int64_t ldf, const uint8_t* wq, int64_t ldq, const void* s, const void* b,
                 bool half, int64_t ldg, float* y, int64_t ldy, int64_t M, int64_t K, int64_t gs,
                 int64_t n0, int64_t n1);
// Rows 0..M-1 of x (M, K; row stride ldx) rounded into the VNNI form's lane layout (xr, xd;
// xs unused, kept for the kernel A/B driver; the caller zeroes the room past K): per 32-value
// block d = amax / 127 (NaN when a value is not finite), q = x / d rounded half to even (0
// where d is 0 or NaN). The same bits as
// quantized_matmul.cpp's portable quantize_x8; AVX-512 (BW), used where the VNNI form runs.
void q8quantize_avx512(int bits, const float* x, int64_t ldx, int64_t M, int64_t K, int8_t* xr,
                       int64_t ldr, float* xd, float* xs, int64_t ldf);
// 12 independent chains x iters vpdpbusd (64 int8 multiply-adds each); returns their sum (the
// int8 form's compute ceiling, as kernel.h's fma loops are the float kernels').
int32_t q8_dot_loop_avx512vnni(int64_t iters);
#endif

}  // namespace edgespec_native
