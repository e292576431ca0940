// The MLX op and primitive: small_matmul(x, w) = x @ w.T for float32 x (..., K), w (N, K),
// evaluated on the CPU by dispatch.h's kernels (there is no GPU form: the Python side uses
// this only on MLX's CPU backend).
#pragma once

#include "mlx/array.h"
#include "mlx/primitives.h"

namespace edgespec_native {

namespace mx = mlx::core;

// Raises std::invalid_argument (ValueError in Python) for other dtypes or shapes.
mx::array small_matmul_op(const mx::array& x, const mx::array& w);

class SmallMatmul : public mx::UnaryPrimitive {
 public:
  explicit SmallMatmul(mx::Stream stream) : mx::UnaryPrimitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override { return "EdgespecSmallMatmul"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;
  // The gradients of x (M, K) @ w.T by MLX's own products: the module path's projections go
  // through this op, and the drafting heads train through that path.
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>& outputs) override;
};

}  // namespace edgespec_native
