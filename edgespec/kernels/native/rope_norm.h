// The MLX ops and primitives around a decoder block's products, where MLX's CPU backend runs
// many small operations (its fast.rms_norm and fast.rope fall back to compositions of
// elementwise ops there, each launched on its own):
//
//   rms_norm(x, w, eps): x * rsqrt(mean(x^2) + eps) * w over the last axis;
//   qkv_rope(y, pos, inv_freq, heads, kv_heads, head_dim, dims, traditional, mscale, scale):
//     the q|k|v product y (M, (heads + 2 kv_heads) head_dim) split into q (1, heads, M, D),
//     k and v (1, kv_heads, M, D), with RoPE on the first `dims` features of every q and k
//     head: angle = (position * scale) * inv_freq[j], those features scaled by mscale first;
//     pairs (j, j + dims/2), or (2j, 2j + 1) when traditional. pos: int32, a scalar offset
//     (row i at offset + i) or one position per row (a tree).
//
// float32, CPU only, plain C++ (the work is a few thousand floats; what they save is MLX's
// per-operation cost). Every row is computed on its own, so a row's result does not depend on
// the rows computed with it. The pure-MLX twins are in edgespec/kernels/rope_norm.py.
#pragma once

#include "mlx/array.h"
#include "mlx/primitives.h"

namespace edgespec_native {

namespace mx = mlx::core;

// The row functions the ops (and the fused block, block.h) run.
// y[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w for rows r < rows of width H.
void rms_rows(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int64_t rows,
              int64_t H, float eps);

struct RopeArgs {
  const float* y;  // (M, (heads + 2 kv_heads) D), row stride ldy
  int64_t ldy;
  const int32_t* pos;
  bool pos_per_row;  // else row m is at pos[0] + m
  const float* inv_freq;
  float *q, *k, *v;  // head h of row m at h * X_h + m * X_m
  int64_t q_h, q_m, k_h, k_m, v_h, v_m;
  int64_t M, heads, kv_heads, D, dims;
  bool traditional;
  float mscale, scale;
};
void qkv_rope_rows(const RopeArgs& a);

// Raise std::invalid_argument (ValueError in Python) for other dtypes or shapes.
mx::array rms_norm_op(const mx::array& x, const mx::array& w, float eps);
std::vector<mx::array> qkv_rope_op(const mx::array& y, const mx::array& pos,
                                   const mx::array& inv_freq, int heads, int kv_heads,
                                   int head_dim, int dims, bool traditional, float mscale,
                                   float scale);

class RmsNorm : public mx::UnaryPrimitive {
 public:
  RmsNorm(mx::Stream stream, float eps) : mx::UnaryPrimitive(stream), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override { return "EdgespecRmsNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return eps_ == static_cast<const RmsNorm&>(other).eps_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  float eps_;
};

class QkvRope : public mx::Primitive {
 public:
  QkvRope(mx::Stream stream, int heads, int kv_heads, int head_dim, int dims, bool traditional,
          float mscale, float scale)
      : mx::Primitive(stream), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim),
        dims_(dims), traditional_(traditional), mscale_(mscale), scale_(scale) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;

  const char* name() const override { return "EdgespecQkvRope"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  int heads_, kv_heads_, head_dim_, dims_;
  bool traditional_;
  float mscale_, scale_;
};

}  // namespace edgespec_native
