// The Python module edgespec's kernels/_native.py loads: the op and what the kernels run on.
#include <nanobind/nanobind.h>
#include <stdexcept>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "block.h"
#include "dispatch.h"
#include "expf_libm.h"
#include "move_rows.h"
#include "pool.h"
#include "quantized_matmul.h"
#include "rope_norm.h"
#include "small_matmul.h"
#include "tree_attention.h"

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_edgespec_native, m) {
  m.doc() = "edgespec's native CPU kernels (an MLX extension); see edgespec/kernels/native.";
  edgespec_native::expf_vector_active();  // its self-check at load, not in a forward
  m.def("small_matmul", &edgespec_native::small_matmul_op, "x"_a, "w"_a,
        "x @ w.T for float32 x (..., K) and w (N, K), reading each row of w once.");
  m.def("quantized_small_matmul", &edgespec_native::quantized_small_matmul_op, "x"_a, "wq"_a,
        "scales"_a, "biases"_a, "group_size"_a, "bits"_a, "q8"_a = false,
        "symmetric"_a = false,
        "x @ dequantize(wq, scales, biases).T in MLX's affine layout (4 or 8 bits); q8: x "
        "quantized to int8 per 32 values first (4 or 8 bits; AVX-512 VNNI or AVX2); symmetric: "
        "every bias is -2^(bits - 1) times its scale, as the caller checked (the VNNI form then "
        "does not read them).");
  m.def("quantized_rows", &edgespec_native::quantized_rows_op, "ids"_a, "wq"_a, "scales"_a,
        "biases"_a, "group_size"_a, "bits"_a,
        "Rows ids of a table in MLX's affine layout (4 or 8 bits, float32 scales and biases), "
        "dequantized with mx.dequantize's bits (QuantizedEmbedding's rows) in one operation; an "
        "id outside the table gives a row of NaN.");
  m.def("has_q8_activations", &edgespec_native::has_q8_activations,
        "Whether quantized_small_matmul(..., q8=True) runs here.");
  m.def("q8_vnni", &edgespec_native::q8_vnni,
        "Whether the int8 form that runs is the AVX-512 VNNI one (else AVX2's).");
  m.def("tree_attention", &edgespec_native::tree_attention_op, "q"_a, "k"_a, "v"_a, "anc"_a,
        "qpos"_a, "key_start"_a, "window"_a, "scale"_a, "softcap"_a,
        "Softmax attention of <= 64 tree nodes over cached + own keys, masked by an ancestor "
        "bitmask, positions and a window (0: none); float32, batch 1.");
  m.def("move_rows", &edgespec_native::move_rows_op, "buffers"_a, "firsts"_a, "path"_a,
        "Each buffer (1, heads, capacity, dim) with rows firsts[b] + path[j] moved to "
        "firsts[b] + j, in the buffer's own memory when nothing else holds it (move_rows.h).");
  m.def("rms_norm", &edgespec_native::rms_norm_op, "x"_a, "w"_a, "eps"_a,
        "x * rsqrt(mean(x^2, -1) + eps) * w for float32 x (..., H) and w (H,).");
  m.def("qkv_rope", &edgespec_native::qkv_rope_op, "y"_a, "pos"_a, "inv_freq"_a, "heads"_a,
        "kv_heads"_a, "head_dim"_a, "dims"_a, "traditional"_a, "mscale"_a, "scale"_a,
        "A q|k|v product (M, (heads + 2 kv_heads) head_dim) split into q, k, v (1, heads, M, D) "
        "with RoPE on q and k (rope_norm.h).");
  auto block_shape = [](int hidden, int heads, int kv_heads, int head_dim, int intermediate,
                        int rope_dims, bool traditional, float mscale, float rope_scale, float eps,
                        float attn_scale, const std::vector<std::vector<int>>& quant, bool q8,
                        bool dual) {
    edgespec_native::BlockShape s{hidden, heads, kv_heads, head_dim, intermediate, rope_dims,
                                  traditional, mscale, rope_scale, eps, attn_scale, {}, q8, dual};
    if (!quant.empty() && quant.size() != 4)
      throw std::invalid_argument("decoder_block: quant takes 4 (group size, bits[, symmetric])");
    for (size_t p = 0; p < quant.size(); ++p) {
      if (quant[p].size() != 2 && quant[p].size() != 3)
        throw std::invalid_argument("decoder_block: quant takes (group size, bits[, symmetric])");
      s.quant[p][0] = quant[p][0];
      s.quant[p][1] = quant[p][1];
      s.quant[p][2] = quant[p].size() == 3 ? quant[p][2] : 0;
    }
    return s;
  };
  m.def(
      "decoder_block",
      [block_shape](const std::vector<edgespec_native::mx::array>& arrays, int hidden, int heads,
                    int kv_heads, int head_dim, int intermediate, int rope_dims, bool traditional,
                    float mscale, float rope_scale, float eps, float attn_scale,
                    const std::vector<std::vector<int>>& quant, bool q8, int64_t slots,
                    int64_t key_start, int64_t window, bool dual, bool sandwich,
                    float softcap) {
        auto s = block_shape(hidden, heads, kv_heads, head_dim, intermediate, rope_dims,
                             traditional, mscale, rope_scale, eps, attn_scale, quant, q8, dual);
        s.sandwich = sandwich;
        s.softcap = softcap;
        s.qk_norm = edgespec_native::qk_norm_given(s, arrays.size(), 1);
        if (arrays.empty()) throw std::invalid_argument("decoder_block: needs x first");
        const int64_t rows = arrays[0].ndim() ? arrays[0].shape(-2) : 0;
        return edgespec_native::decoder_block_op(arrays, s, {{rows, slots, key_start, window}});
      },
      "arrays"_a, "hidden"_a, "heads"_a, "kv_heads"_a, "head_dim"_a, "intermediate"_a,
      "rope_dims"_a, "traditional"_a, "mscale"_a, "rope_scale"_a, "eps"_a, "attn_scale"_a,
      "quant"_a, "q8"_a, "slots"_a, "key_start"_a, "window"_a, "dual"_a = false,
      "sandwich"_a = false, "softcap"_a = 0.0f,
      "A pre-norm decoder block over N <= 64 tokens as one operation (block.h): returns (out, "
      "keys, values); dual: the EAGLE-3 head's layer (x = embedding | hidden state); "
      "sandwich: Gemma's block (two norm weights more, after the q/k norms); softcap: "
      "attention scores capped (Gemma 2; 0: none).");
  m.def(
      "decoder_block_many",
      [block_shape](const std::vector<edgespec_native::mx::array>& arrays, int hidden, int heads,
                    int kv_heads, int head_dim, int intermediate, int rope_dims, bool traditional,
                    float mscale, float rope_scale, float eps, float attn_scale,
                    const std::vector<std::vector<int>>& quant, bool q8,
                    const std::vector<int64_t>& rows, const std::vector<int64_t>& slots,
                    const std::vector<int64_t>& key_starts, const std::vector<int64_t>& windows,
                    bool dual, bool sandwich, float softcap) {
        auto s = block_shape(hidden, heads, kv_heads, head_dim, intermediate, rope_dims,
                             traditional, mscale, rope_scale, eps, attn_scale, quant, q8, dual);
        s.sandwich = sandwich;
        s.softcap = softcap;
        if (slots.size() != rows.size() || key_starts.size() != rows.size() ||
            windows.size() != rows.size())
          throw std::invalid_argument(
              "decoder_block_many: rows, slots, key_starts and windows need one entry per "
              "sequence");
        std::vector<edgespec_native::SegmentSpec> segs;
        for (size_t g = 0; g < rows.size(); ++g)
          segs.push_back({rows[g], slots[g], key_starts[g], windows[g]});
        s.qk_norm = !rows.empty() && edgespec_native::qk_norm_given(s, arrays.size(), rows.size());
        return edgespec_native::decoder_block_op(arrays, s, segs);
      },
      "arrays"_a, "hidden"_a, "heads"_a, "kv_heads"_a, "head_dim"_a, "intermediate"_a,
      "rope_dims"_a, "traditional"_a, "mscale"_a, "rope_scale"_a, "eps"_a, "attn_scale"_a,
      "quant"_a, "q8"_a, "rows"_a, "slots"_a, "key_starts"_a, "windows"_a, "dual"_a = false,
      "sandwich"_a = false, "softcap"_a = 0.0f,
      "decoder_block over several sequences' rows in one operation (block.h): each sequence's "
      "rows attend to its own cache (arrays: decoder_block's, then keys and values of each "
      "sequence after the first); returns (out, keys_1, values_1, keys_2, values_2, ...); "
      "dual: the EAGLE-3 head's layer.");
  nb::class_<edgespec_native::DecoderStack>(
      m, "DecoderStack",
      "A model's decoder blocks as one call per forward (block.h): each layer's arrays after "
      "x, keys, values, anc and qpos, and its decoder_block shape, held from construction.")
      .def(
          "__init__",
          [block_shape](edgespec_native::DecoderStack* self,
                        std::vector<std::vector<edgespec_native::mx::array>> layer_args,
                        const std::vector<nb::tuple>& shapes) {
            std::vector<edgespec_native::BlockShape> s;
            for (const auto& t : shapes) {
              if (t.size() != 12 && t.size() != 14)
                throw std::invalid_argument(
                    "DecoderStack: a shape is (hidden, heads, kv_heads, head_dim, intermediate, "
                    "rope_dims, traditional, mscale, rope_scale, eps, attn_scale, quant[, "
                    "sandwich, softcap])");
              s.push_back(block_shape(
                  nb::cast<int>(t[0]), nb::cast<int>(t[1]), nb::cast<int>(t[2]),
                  nb::cast<int>(t[3]), nb::cast<int>(t[4]), nb::cast<int>(t[5]),
                  nb::cast<bool>(t[6]), nb::cast<float>(t[7]), nb::cast<float>(t[8]),
                  nb::cast<float>(t[9]), nb::cast<float>(t[10]),
                  nb::cast<std::vector<std::vector<int>>>(t[11]), false, false));
              if (t.size() == 14) {
                s.back().sandwich = nb::cast<bool>(t[12]);
                s.back().softcap = nb::cast<float>(t[13]);
              }
            }
            new (self) edgespec_native::DecoderStack(std::move(layer_args), std::move(s));
          },
          "layer_args"_a, "shapes"_a)
      .def("__len__", &edgespec_native::DecoderStack::layers)
      .def(
          "forward",
          [](const edgespec_native::DecoderStack& st, const edgespec_native::mx::array& x,
             const std::vector<edgespec_native::mx::array>& keys,
             const std::vector<edgespec_native::mx::array>& values,
             const std::vector<edgespec_native::mx::array>& anc,
             const std::vector<edgespec_native::mx::array>& qpos,
             const std::vector<int64_t>& slots, const std::vector<int64_t>& key_starts,
             const std::vector<int64_t>& windows, bool q8, const std::vector<int>& capture,
             bool in_place, const std::vector<edgespec_native::mx::array>& after) {
            auto r = st.forward(x, keys, values, anc, qpos, slots, key_starts, windows, q8,
                                capture, in_place, after);
            return std::make_tuple(r.out, r.keys, r.values, r.captured);
          },
          "x"_a, "keys"_a, "values"_a, "anc"_a, "qpos"_a, "slots"_a, "key_starts"_a,
          "windows"_a, "q8"_a, "capture"_a, "in_place"_a = false,
          "after"_a = std::vector<edgespec_native::mx::array>{},
          "Every layer over x's rows in turn: returns (out, keys, values, captured), the "
          "layers' cache buffers with the new rows and x as it entered each layer in capture. "
          "in_place (the caller gives the buffers up: no other array holds or views them): "
          "where the layers share one key/value shape and no buffer is given twice, the "
          "operation that makes out writes the rows into the buffers given, and keys and "
          "values come back empty (anything that reads the buffers must come after out: "
          "`after` of the next forward, mx.depends). after: arrays the operation waits for "
          "and does not read.")
      .def(
          "forward_many",
          [](const edgespec_native::DecoderStack& st, const edgespec_native::mx::array& x,
             const std::vector<std::vector<edgespec_native::mx::array>>& keys,
             const std::vector<std::vector<edgespec_native::mx::array>>& values,
             const edgespec_native::mx::array& anc, const edgespec_native::mx::array& qpos,
             const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& slots,
             const std::vector<int64_t>& key_starts, const std::vector<int64_t>& windows,
             bool q8, const std::vector<int>& capture,
             const std::vector<edgespec_native::mx::array>& after)
              -> std::optional<std::tuple<edgespec_native::mx::array,
                                          std::vector<edgespec_native::mx::array>>> {
            std::vector<edgespec_native::mx::array> captured;
            auto out = st.forward_many(x, keys, values, anc, qpos, rows, slots, key_starts,
                                       windows, q8, capture, after, &captured);
            if (!out) return std::nullopt;
            return std::make_tuple(*out, captured);
          },
          "x"_a, "keys"_a, "values"_a, "anc"_a, "qpos"_a, "rows"_a, "slots"_a, "key_starts"_a,
          "windows"_a, "q8"_a, "capture"_a, "after"_a,
          "Several sequences' rows through every layer in one operation, each sequence over "
          "its own cache buffers (keys[g][i]: sequence g's layer i), written in place: returns "
          "(out, captured), or None where the layers differ in key/value shape or a buffer is "
          "given twice. Everything that reads the buffers must come after out.");
  m.def("decoder_blocks_copies", &edgespec_native::decoder_blocks_copies,
        "How many cache buffers a stack forward has copied before writing them in place.");
  m.def("isa", &edgespec_native::isa, "The ISA the kernels run: avx512, avx2 or generic.");
  m.def("set_isa", &edgespec_native::set_isa, "name"_a,
        "Selects an ISA the CPU supports (for tests); returns whether it did.");
  m.def("supported_isas", &edgespec_native::supported_isas, "The CPU's ISAs, best first.");
  m.def("buffered_dequantization", &edgespec_native::buffered_dequantization,
        "Whether quantized products of more than 4 rows dequantize each block of weights once.");
  m.def("set_buffered_dequantization", &edgespec_native::set_buffered_dequantization, "on"_a,
        "Turns that on or off (tests and A/B timings).");
  m.def("dequantized_gemm_rows", &edgespec_native::dequantized_gemm_rows,
        "The fewest rows for which a quantized product dequantizes each thread's chunk of "
        "weights once and runs the float kernel on it.");
  m.def("threads", &edgespec_native::threads, "Threads the kernels split N over.");
  m.def("pool_spin_us", &edgespec_native::Pool::spin_us,
        "How long (us) the kernels' helper threads poll for the next job before they sleep.");
  m.def(
      "set_pool_spin_us",
      [](long long us) {
        if (us < 0 || us > 100000)
          throw std::invalid_argument("set_pool_spin_us: " + std::to_string(us) +
                                      " us; allowed: 0 .. 100000");
        edgespec_native::Pool::set_spin_us(static_cast<int>(us));
      },
      "us"_a, "Sets that (tests and A/B timings; the results are the same).");
  m.def("fma_peak", &edgespec_native::fma_peak, "rounds"_a = 5, "all_threads"_a = true,
        "Float multiply-adds per second the kernels' threads sustain in an FMA loop (best of "
        "rounds): the compute ceiling; all_threads=False: the calling thread alone.");
  m.def("q8_peak", &edgespec_native::q8_peak, "rounds"_a = 5, "all_threads"_a = true,
        "Int8 multiply-adds per second the kernels' threads sustain in a vpdpbusd loop (best of "
        "rounds): the int8 form's compute ceiling; 0 where the AVX-512 VNNI form does not run.");
  m.def(
      "exp_neg_libm",
      [](const std::vector<float>& x) {
        std::vector<float> y(x.size());
        edgespec_native::exp_neg_libm(x.data(), y.data(), static_cast<int64_t>(x.size()));
        return y;
      },
      "x"_a, "e^-x for each value as the int8 forward's SiLU takes it: libm's bits (for tests).");
  m.def(
      "silu_libm",
      [](const std::vector<float>& gate, const std::vector<float>& up) {
        if (gate.size() != up.size()) throw std::invalid_argument("silu_libm: gate and up differ in length");
        std::vector<float> act(gate.size());
        edgespec_native::silu_libm(gate.data(), up.data(), act.data(),
                                   static_cast<int64_t>(gate.size()));
        return act;
      },
      "gate"_a, "up"_a, "gate / (1 + e^-gate) * up as the int8 forward's SiLU computes it (for tests).");
  m.def("expf_vector_active", &edgespec_native::expf_vector_active,
        "Whether that SiLU's exp runs 4 lanes at a time here (AVX2 and FMA, and a check against "
        "libm's exp passed).");
  m.attr("built_for_mlx") = EDGESPEC_MLX_VERSION;
}
