// See rope_norm.h.
#include "rope_norm.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"

namespace edgespec_native {

namespace {

// The message is a literal, so that a check that holds allocates nothing.
void check(bool ok, const char* op, const char* what) {
  if (!ok) throw std::invalid_argument(std::string(op) + ": " + what);
}

mx::Stream cpu_stream() {
  // The caller's current stream when it is a CPU one (a thread's own stream), else the CPU's.
  auto s = mx::to_stream(mx::StreamOrDevice{});
  return s.device.type == mx::Device::cpu ? s : mx::to_stream(mx::Device::cpu);
}

}  // namespace

// ---- rms_norm -------------------------------------------------------------------------------

mx::array rms_norm_op(const mx::array& x, const mx::array& w, float eps) {
  check(x.dtype() == mx::float32 && w.dtype() == mx::float32, "rms_norm",
        "x and w must be float32");
  check(x.ndim() >= 1 && w.ndim() == 1 && w.shape(0) == x.shape(-1), "rms_norm",
        "need x (..., H) and w (H,)");
  const auto s = cpu_stream();
  return mx::array(x.shape(), mx::float32, std::make_shared<RmsNorm>(s, eps),
                   {mx::contiguous(x, false, s), mx::contiguous(w, false, s)});
}

std::vector<mx::Shape> RmsNorm::output_shapes(const std::vector<mx::array>& in) {
  return {in[0].shape()};
}

void RmsNorm::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto &x = inputs[0], &w = inputs[1];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(x);
  encoder.set_input_array(w);
  encoder.set_output_array(out);
  const int64_t H = x.ndim() ? x.shape(-1) : 1;
  encoder.dispatch([xp = x.data<float>(), wp = w.data<float>(), yp = out.data<float>(),
                    rows = H ? int64_t(x.size()) / H : 0, H, eps = eps_]() {
    rms_rows(xp, H, wp, yp, H, rows, H, eps);
  });
}

void rms_rows(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int64_t rows,
              int64_t H, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    float ss = 0.0f;
    for (int64_t i = 0; i < H; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
    for (int64_t i = 0; i < H; ++i) yr[i] = xr[i] * inv * w[i];
  }
}

void RmsNorm::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("EdgespecRmsNorm has no GPU form; use mx.fast.rms_norm there");
}

// ---- qkv_rope -------------------------------------------------------------------------------

std::vector<mx::array> qkv_rope_op(const mx::array& y, const mx::array& pos,
                                   const mx::array& inv_freq, int heads, int kv_heads,
                                   int head_dim, int dims, bool traditional, float mscale,
                                   float scale) {
  const char* op = "qkv_rope";
  check(y.dtype() == mx::float32 && inv_freq.dtype() == mx::float32 && pos.dtype() == mx::int32,
        op, "need float32 y and inv_freq and int32 positions");
  check(heads > 0 && kv_heads > 0 && head_dim > 0 && dims >= 0 && dims <= head_dim &&
            dims % 2 == 0,
        op, "need heads, kv_heads, head_dim > 0 and an even dims <= head_dim");
  check(y.ndim() == 2 && y.shape(1) == (heads + 2 * kv_heads) * head_dim, op,
        "need y (M, (heads + 2 kv_heads) head_dim)");
  const int M = y.shape(0);
  check(pos.ndim() == 0 || (pos.ndim() == 1 && pos.shape(0) == M), op,
        "positions must be a scalar offset or one per row");
  check(inv_freq.ndim() == 1 && inv_freq.shape(0) == dims / 2, op, "need inv_freq (dims / 2,)");
  const auto s = cpu_stream();
  return mx::array::make_arrays(
      {{1, heads, M, head_dim}, {1, kv_heads, M, head_dim}, {1, kv_heads, M, head_dim}},
      {mx::float32, mx::float32, mx::float32},
      std::make_shared<QkvRope>(s, heads, kv_heads, head_dim, dims, traditional, mscale, scale),
      {mx::contiguous(y, false, s), mx::contiguous(pos, false, s),
       mx::contiguous(inv_freq, false, s)});
}

std::vector<mx::Shape> QkvRope::output_shapes(const std::vector<mx::array>& in) {
  const int M = in[0].shape(0);
  return {{1, heads_, M, head_dim_}, {1, kv_heads_, M, head_dim_}, {1, kv_heads_, M, head_dim_}};
}

bool QkvRope::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const QkvRope&>(other);
  return heads_ == o.heads_ && kv_heads_ == o.kv_heads_ && head_dim_ == o.head_dim_ &&
         dims_ == o.dims_ && traditional_ == o.traditional_ && mscale_ == o.mscale_ &&
         scale_ == o.scale_;
}

namespace {

// Head `src` (D floats of one row) to `dst`, rotated by the row's (cos, sin) pairs.
inline void rotate(const float* src, float* dst, const float* c, const float* sn,
                   const RopeArgs& a) {
  const int64_t half = a.dims / 2;
  if (a.traditional) {
    for (int64_t j = 0; j < half; ++j) {
      const float x1 = src[2 * j] * a.mscale, x2 = src[2 * j + 1] * a.mscale;
      dst[2 * j] = x1 * c[j] - x2 * sn[j];
      dst[2 * j + 1] = x1 * sn[j] + x2 * c[j];
    }
  } else {
    for (int64_t j = 0; j < half; ++j) {
      const float x1 = src[j] * a.mscale, x2 = src[j + half] * a.mscale;
      dst[j] = x1 * c[j] - x2 * sn[j];
      dst[j + half] = x1 * sn[j] + x2 * c[j];
    }
  }
  for (int64_t j = a.dims; j < a.D; ++j) dst[j] = src[j];
}

}  // namespace

void qkv_rope_rows(const RopeArgs& a) {
  const int64_t half = a.dims / 2;
  std::vector<float> c(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t m = 0; m < a.M; ++m) {
    const float p = static_cast<float>(a.pos_per_row ? a.pos[m] : a.pos[0] + m) * a.scale;
    for (int64_t j = 0; j < half; ++j) {
      const float theta = p * a.inv_freq[j];
      c[j] = std::cos(theta);
      sn[j] = std::sin(theta);
    }
    const float* row = a.y + m * a.ldy;
    for (int64_t h = 0; h < a.heads; ++h)
      rotate(row + h * a.D, a.q + h * a.q_h + m * a.q_m, c.data(), sn.data(), a);
    const float* kr = row + a.heads * a.D;
    const float* vr = kr + a.kv_heads * a.D;
    for (int64_t h = 0; h < a.kv_heads; ++h) {
      rotate(kr + h * a.D, a.k + h * a.k_h + m * a.k_m, c.data(), sn.data(), a);
      float* vd = a.v + h * a.v_h + m * a.v_m;
      for (int64_t j = 0; j < a.D; ++j) vd[j] = vr[h * a.D + j];
    }
  }
}

void QkvRope::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto &y = inputs[0], &pos = inputs[1], &inv = inputs[2];
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& a : inputs) encoder.set_input_array(a);
  for (auto& o : outputs) {
    o.set_data(mx::allocator::malloc(o.nbytes()));
    encoder.set_output_array(o);
  }
  const int64_t M = y.shape(0), D = head_dim_;
  RopeArgs args{y.data<float>(), int64_t(y.shape(1)), pos.data<int32_t>(), pos.ndim() == 1,
                inv.data<float>(), outputs[0].data<float>(), outputs[1].data<float>(),
                outputs[2].data<float>(), M * D, D, M * D, D, M * D, D,
                M, heads_, kv_heads_, D, dims_, traditional_, mscale_, scale_};
  encoder.dispatch([args]() { qkv_rope_rows(args); });
}

void QkvRope::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("EdgespecQkvRope has no GPU form; use mx.fast.rope there");
}

}  // namespace edgespec_native
