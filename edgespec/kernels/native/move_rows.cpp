// See move_rows.h.
#include "move_rows.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"

namespace edgespec_native {

namespace {

// The message is a literal, so that a check that holds allocates nothing.
void check(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("move_rows: ") + what);
}

void check(bool ok, const std::string& what) { check(ok, what.c_str()); }

}  // namespace

std::vector<mx::array> move_rows_op(const std::vector<mx::array>& buffers,
                                    const std::vector<int64_t>& firsts,
                                    const std::vector<int64_t>& path) {
  check(firsts.size() == buffers.size(), "need one first slot per buffer");
  check(!path.empty() && path[0] >= 0, "the path must be a non-empty list of rows from 0 on");
  for (size_t j = 1; j < path.size(); ++j)
    check(path[j] > path[j - 1], "the path must be strictly increasing");
  auto s = mx::to_stream(mx::StreamOrDevice{});
  if (s.device.type != mx::Device::cpu) s = mx::to_stream(mx::Device::cpu);
  std::vector<mx::array> out;
  out.reserve(buffers.size());
  for (size_t b = 0; b < buffers.size(); ++b) {
    const auto& buf = buffers[b];
    check(buf.ndim() == 4 && buf.shape(0) == 1, "buffers must be (1, heads, capacity, dim)");
    check(firsts[b] >= 0 && firsts[b] + path.back() < buf.shape(2),
          "first slot + path must lie inside the buffer's capacity " +
              std::to_string(buf.shape(2)) + "; got first " + std::to_string(firsts[b]) +
              ", last path entry " + std::to_string(path.back()));
    out.push_back(mx::array(buf.shape(), buf.dtype(), std::make_shared<MoveRows>(s, firsts[b], path),
                            {buf}));
  }
  return out;
}

void MoveRows::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& in = inputs[0];
  // MLX's rule for reusing an input's memory (as its own copies and slice updates do); a view
  // (strided or offset) is copied instead.
  const bool reuse = in.is_donatable() && in.flags().row_contiguous &&
                     in.data_size() == in.size();
  if (reuse)
    out.copy_shared_buffer(in);
  else
    out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(in);
  encoder.set_output_array(out);
  const int64_t heads = in.shape(1), cap = in.shape(2), dim = in.shape(3);
  const int64_t esz = in.itemsize();
  std::vector<int64_t> strides(in.strides().begin(), in.strides().end());
  encoder.dispatch([src = static_cast<const char*>(in.data<void>()),
                    dst = static_cast<char*>(out.data<void>()), reuse, heads, cap, dim, esz,
                    strides, first = first_, path = path_]() {
    const int64_t row = dim * esz;
    if (!reuse) {  // the whole input, then the moves within the copy
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t r = 0; r < cap; ++r) {
          const char* s = src + (h * strides[1] + r * strides[2]) * esz;
          char* d = dst + (h * cap + r) * row;
          if (strides[3] == 1) {
            std::memcpy(d, s, row);
          } else {
            for (int64_t c = 0; c < dim; ++c)
              std::memcpy(d + c * esz, s + c * strides[3] * esz, esz);
          }
        }
    }
    // In increasing j: slot first + j is written after every source first + path[i] with
    // i <= j was read (path[i] >= i), and no later source (path[i] > path[j] >= j) is written.
    for (int64_t h = 0; h < heads; ++h)
      for (size_t j = 0; j < path.size(); ++j)
        if (path[j] != int64_t(j))
          std::memcpy(dst + (h * cap + first + int64_t(j)) * row,
                      dst + (h * cap + first + path[j]) * row, row);
  });
}

void MoveRows::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("EdgespecMoveRows has no GPU form; kernels/compact.py gathers there");
}

}  // namespace edgespec_native
