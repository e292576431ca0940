// The MLX op and primitive for kernel_q.h: quantized_small_matmul(x, wq, scales, biases,
// group_size, bits) = x @ dequantize(...).T for float32 x (..., K) and MLX's affine layout
// (bits 4 or 8, group_size 32, 64 or 128, scales and biases both float32 or both float16).
// CPU only, like small_matmul.h. Runs the AVX-512 or AVX2 code on CPUs that have it, else
// plain C++.
//
// Float16 scales and biases are the same values as their float32 copies wherever those are
// float16 numbers (GGUF's Q4_0/Q4_1/Q8_0 store them so): the products widen each one exactly,
// so the bits are the same, and a step reads half the bytes for them. A 4-bit product with
// float32 ones reads 8 bytes of them for every 16 of packed weights; with float16 ones, 4.
// The int8 forms read them as they are; the float-activation forms widen a chunk's into a
// float32 buffer first.
#pragma once

#include "mlx/array.h"
#include "mlx/primitives.h"

namespace edgespec_native {

namespace mx = mlx::core;

// Raises std::invalid_argument (ValueError in Python) for other layouts, dtypes or shapes.
// symmetric: every bias is -2^(bits - 1) times its scale (a symmetric format, as GGUF's Q8_0;
// the caller checked it): the AVX-512 VNNI int8 form then makes each bias from its scale, one
// multiply by a power of two, the same value, and never reads the biases; other forms read them.
mx::array quantized_small_matmul_op(const mx::array& x, const mx::array& wq,
                                    const mx::array& scales, const mx::array& biases,
                                    int group_size, int bits, bool q8 = false,
                                    bool symmetric = false);

// The op's body: y (M, N; row stride ldy) = x (M, K; row stride ldx) @ dequantize(wq, scales,
// biases).T for contiguous packed rows (K * bits / 32 words) and scales/biases (K / group_size),
// on the pool's threads. Also run inside the fused decoder block (block.h).
// scales and biases: float32, or float16 (their bits) where half.
void quantized_small_matmul(const float* x, int64_t ldx, const uint32_t* wq, const void* scales,
                            const void* biases, bool half, float* y, int64_t ldy, int64_t M,
                            int64_t N, int64_t K, int group_size, int bits, bool q8,
                            bool symmetric = false);

// Whether q8 = true (x quantized to int8 per 32-value block, kernel_q.h's int8 forms) can run:
// the AVX-512 or AVX2 code is in use (AVX-512 with BW and VNNI runs the VNNI form, else the
// AVX2 one; the same bits).
bool has_q8_activations();
// Whether that form is the AVX-512 VNNI one (else the AVX2 one runs).
bool q8_vnni();

// Whether products of more than 4 rows dequantize each block of packed rows once for all rows
// (kernel_q.h's buf) rather than once per 4-row block: by default on Intel CPUs, where it was
// measured faster; EDGESPEC_QBUFFER=0/1 decides instead, and so does the setter (for tests).
bool buffered_dequantization();
void set_buffered_dequantization(bool on);

// The fewest rows of x for which each thread dequantizes its chunk of packed rows into a float
// buffer once and runs the float kernel (kernel.h) on it, every 4-row block reading the float
// weights from L2: 9 rows where the weights are otherwise dequantized per 4-row block, 33
// where they are buffered (docs/measurements.md, "Quantized products of 9 or more rows through
// the float kernel"). The same bits either way: the float kernel takes each dequantized weight
// in qblock's order.
int64_t dequantized_gemm_rows();

class QuantizedSmallMatmul : public mx::UnaryPrimitive {
 public:
  QuantizedSmallMatmul(mx::Stream stream, int group_size, int bits, bool q8, bool symmetric)
      : mx::UnaryPrimitive(stream),
        group_size_(group_size),
        bits_(bits),
        q8_(q8),
        symmetric_(symmetric) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override { return "EdgespecQuantizedSmallMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const QuantizedSmallMatmul&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_ && q8_ == o.q8_ &&
           symmetric_ == o.symmetric_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  int group_size_;
  int bits_;
  bool q8_;
  bool symmetric_;
};

// Rows `ids` (int32 or uint32, any shape) of a table in MLX's affine layout (wq (V, K bits /
// 32) uint32, scales and biases (V, K / group_size) float32; 4 or 8 bits), dequantized as
// mx.dequantize does: scale * q rounded, then + bias rounded (no fused multiply-add), so the
// bits of QuantizedEmbedding's rows, in one operation where its gathers and dequantization make
// some thirty. An id outside [0, V) gives a row of NaN. Output: ids.shape + (K,), float32.
mx::array quantized_rows_op(const mx::array& ids, const mx::array& wq, const mx::array& scales,
                            const mx::array& biases, int group_size, int bits);

class QuantizedRows : public mx::UnaryPrimitive {
 public:
  QuantizedRows(mx::Stream stream, int group_size, int bits)
      : mx::UnaryPrimitive(stream), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override { return "EdgespecQuantizedRows"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const QuantizedRows&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  int group_size_;
  int bits_;
};

}  // namespace edgespec_native
