// Keeping a verified path in the KV cache without a copy of the cache: the rows
// first + path[j] of a (1, heads, capacity, dim) buffer moved to first + j, in the buffer itself
// when nothing else holds it.
//
// KVCache.commit (edgespec/cache.py, through kernels/compact.py's move_rows) keeps the accepted
// branch of a draft tree. Through MLX's ops that is a gather of the rows and a slice update per
// buffer; the update can find the buffer still held by the gather, and then copies the whole
// cache layer. This operation is one per buffer and single-output: when its
// input is donatable (MLX's rule: the only reference to its data, which the cache gives up as it
// stores the result) the output takes the input's memory and only the moved rows are written;
// otherwise the output is a fresh copy with the rows moved. Either way the result is what the
// gather and the slice update give, bit for bit (rows are copied, never computed). Any dtype.
#pragma once

#include <cstdint>
#include <vector>

#include "mlx/array.h"
#include "mlx/primitives.h"

namespace edgespec_native {

namespace mx = mlx::core;

// Raise std::invalid_argument (ValueError in Python) for shapes or paths it does not take:
// buffers (1, heads, capacity, dim), any dtype; firsts, one per buffer; path non-empty, strictly
// increasing, path[0] >= 0 and first + path[-1] < capacity. Strictly increasing makes
// path[j] >= j, which is what moving the rows in place in increasing j needs.
std::vector<mx::array> move_rows_op(const std::vector<mx::array>& buffers,
                                    const std::vector<int64_t>& firsts,
                                    const std::vector<int64_t>& path);

class MoveRows : public mx::UnaryPrimitive {
 public:
  MoveRows(mx::Stream stream, int64_t first, std::vector<int64_t> path)
      : mx::UnaryPrimitive(stream), first_(first), path_(std::move(path)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override { return "EdgespecMoveRows"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const MoveRows&>(other);
    return first_ == o.first_ && path_ == o.path_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  int64_t first_;
  std::vector<int64_t> path_;
};

}  // namespace edgespec_native
