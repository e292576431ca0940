// The Python module edgespec's kernels/_native.py loads: the op and what the kernels run on.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "dispatch.h"
#include "quantized_matmul.h"
#include "small_matmul.h"
#include "tree_attention.h"

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_edgespec_native, m) {
  m.doc() = "edgespec's native CPU kernels (an MLX extension); see edgespec/kernels/native.";
  m.def("small_matmul", &edgespec_native::small_matmul_op, "x"_a, "w"_a,
        "x @ w.T for float32 x (..., K) and w (N, K), reading each row of w once.");
  m.def("quantized_small_matmul", &edgespec_native::quantized_small_matmul_op, "x"_a, "wq"_a,
        "scales"_a, "biases"_a, "group_size"_a, "bits"_a,
        "x @ dequantize(wq, scales, biases).T in MLX's affine layout (4 or 8 bits).");
  m.def("tree_attention", &edgespec_native::tree_attention_op, "q"_a, "k"_a, "v"_a, "anc"_a,
        "qpos"_a, "key_start"_a, "window"_a, "scale"_a, "softcap"_a,
        "Softmax attention of <= 64 tree nodes over cached + own keys, masked by an ancestor "
        "bitmask, positions and a window (0: none); float32, batch 1.");
  m.def("isa", &edgespec_native::isa, "The ISA the kernels run: avx512, avx2 or generic.");
  m.def("set_isa", &edgespec_native::set_isa, "name"_a,
        "Selects an ISA the CPU supports (for tests); returns whether it did.");
  m.def("supported_isas", &edgespec_native::supported_isas, "The CPU's ISAs, best first.");
  m.def("threads", &edgespec_native::threads, "Threads the kernels split N over.");
  m.attr("built_for_mlx") = EDGESPEC_MLX_VERSION;
}
