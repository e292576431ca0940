// The MLX op and primitive: tree_attention(q, k, v, anc, qpos, key_start, window, scale,
// softcap) on the CPU, float32, batch 1 (attention_core.h has the contract). q (1, H, N, D),
// k/v (1, H_kv, S = L + N, D) with the last axis contiguous (cache slices are fine), anc
// (N, 2) uint32, qpos (N,) int32; N <= 64, D <= 256.
#pragma once

#include <vector>

#include "attention_core.h"
#include "mlx/array.h"
#include "mlx/primitives.h"

namespace edgespec_native {

namespace mx = mlx::core;

// attention_core.h's contract for all items of `args`, split over the pool's threads when
// there is enough work (the op's body; also run inside the fused block). `helpers_awake`: the
// caller has just run a pool job (the fused block, between its q|k|v and o products), so the
// helpers are still polling and even a decode step's few items are worth splitting.
void run_tree_attention(const AttnArgs& args, bool helpers_awake = false);

// Several independent calls (a forward's sequences, each over its own cache) as one pool job:
// each call's items go in the chunks run_tree_attention would make of them alone, so each gets
// the same bits, and the threads share every call's chunks instead of meeting once per call.
void run_tree_attention_many(const std::vector<AttnArgs>& calls, bool helpers_awake = false);

// Raises std::invalid_argument (ValueError in Python) for other dtypes or shapes.
mx::array tree_attention_op(const mx::array& q, const mx::array& k, const mx::array& v,
                            const mx::array& anc, const mx::array& qpos, int64_t key_start,
                            int64_t window, float scale, float softcap);

class TreeAttention : public mx::UnaryPrimitive {
 public:
  TreeAttention(mx::Stream stream, int64_t key_start, int64_t window, float scale,
                float softcap)
      : mx::UnaryPrimitive(stream), key_start_(key_start), window_(window), scale_(scale),
        softcap_(softcap) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override { return "EdgespecTreeAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  int64_t key_start_, window_;
  float scale_, softcap_;
};

}  // namespace edgespec_native
