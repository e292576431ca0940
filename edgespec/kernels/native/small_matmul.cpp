// See small_matmul.h.
#include "small_matmul.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "dispatch.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"

namespace edgespec_native {

namespace {

// A (rows, cols) view's element (r, c) is at p[r * rs + c * cs]. The kernels need unit
// column stride; anything else is copied into `tmp` first (rare: MLX hands over contiguous
// arrays and row slices in practice).
const float* unit_stride(const float* p, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                         std::vector<float>& tmp, int64_t& ld) {
  if (cs == 1 || cols == 1) {
    ld = rows == 1 ? cols : rs;
    return p;
  }
  tmp.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) tmp[r * cols + c] = p[r * rs + c * cs];
  ld = cols;
  return tmp.data();
}

}  // namespace

mx::array small_matmul_op(const mx::array& x, const mx::array& w) {
  if (x.dtype() != mx::float32 || w.dtype() != mx::float32)
    throw std::invalid_argument("small_matmul: x and w must be float32");
  if (w.ndim() != 2 || x.ndim() < 1 || x.shape(-1) != w.shape(1))
    throw std::invalid_argument("small_matmul: need x (..., K) and w (N, K) with the same K");
  // The caller's current stream when it is a CPU one (a thread's own stream), else the CPU's.
  auto s = mx::to_stream(mx::StreamOrDevice{});
  if (s.device.type != mx::Device::cpu) s = mx::to_stream(mx::Device::cpu);
  int64_t M = 1;
  for (int i = 0; i + 1 < static_cast<int>(x.ndim()); ++i) M *= x.shape(i);
  const int K = w.shape(1), N = w.shape(0);
  mx::Shape out_shape = x.shape();
  out_shape.back() = N;
  auto x2 = mx::reshape(x, {static_cast<int>(M), K}, s);
  auto y = mx::array({static_cast<int>(M), N}, mx::float32, std::make_shared<SmallMatmul>(s),
                     {x2, w});
  return mx::reshape(y, out_shape, s);
}

std::vector<mx::Shape> SmallMatmul::output_shapes(const std::vector<mx::array>& inputs) {
  return {{inputs[0].shape(0), inputs[1].shape(0)}};
}

void SmallMatmul::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& x = inputs[0];
  const auto& w = inputs[1];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(x);
  encoder.set_input_array(w);
  encoder.set_output_array(out);
  encoder.dispatch([xp = x.data<float>(), wp = w.data<float>(), yp = out.data<float>(),
                    M = int64_t(x.shape(0)), K = int64_t(x.shape(1)), N = int64_t(w.shape(0)),
                    xs0 = int64_t(x.strides()[0]), xs1 = int64_t(x.strides()[1]),
                    ws0 = int64_t(w.strides()[0]), ws1 = int64_t(w.strides()[1])]() {
    if (M == 0 || N == 0) return;
    if (K == 0) {
      for (int64_t i = 0; i < M * N; ++i) yp[i] = 0.0f;
      return;
    }
    std::vector<float> xtmp, wtmp;
    int64_t ldx = 0, ldw = 0;
    const float* xc = unit_stride(xp, M, K, xs0, xs1, xtmp, ldx);
    const float* wc = unit_stride(wp, N, K, ws0, ws1, wtmp, ldw);
    small_matmul(xc, ldx, wc, ldw, yp, N, M, N, K);
  });
}

std::vector<mx::array> SmallMatmul::vjp(const std::vector<mx::array>& primals,
                                        const std::vector<mx::array>& cotangents,
                                        const std::vector<int>& argnums,
                                        const std::vector<mx::array>&) {
  const auto& g = cotangents[0];  // (M, N)
  std::vector<mx::array> grads;
  for (int arg : argnums) {
    if (arg == 0)
      grads.push_back(mx::matmul(g, primals[1], stream()));  // (M, K)
    else
      grads.push_back(mx::matmul(mx::transpose(g, {1, 0}, stream()), primals[0], stream()));
  }
  return grads;
}

void SmallMatmul::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("EdgespecSmallMatmul has no GPU form; use x @ w.T there");
}

}  // namespace edgespec_native
