// A whole pre-norm decoder block (llama-style: RMSNorm, one q|k|v product, qwen3's per-head q/k
// RMSNorm where given, RoPE, tree attention over the KV cache, o_proj, residual, RMSNorm, one
// gate|up product, SiLU, down, residual) as one MLX operation, for the small inputs of
// decoding and verification (batch 1, N <= 64
// tokens; float32 or 4/8-bit weights, float32 activations). MLX's CPU backend costs microseconds per operation whatever its
// size, and a block had about 15 of them around its four products; here it has one.
//
//   decoder_block([x, keys, values, anc, qpos, inv_freq, n1, n2, bqkv, bgu, bd, weights...],
//                 shape, slots, key_start, window) -> (out, keys', values')
//
// shape.sandwich: Gemma 2/3's block (BlockShape), two norm weights (hidden,) more after the
// q/k norm weights.
//
// weights: for q|k|v, o, gate|up and down in turn, the float32 rows (N, K), or, where
// shape.quant says so, MLX's affine packing (uint32 (N, K bits / 32), float32 scales and
// biases (N, K / group size)): the quantized kernel's products (quantized_matmul.h). Then,
// for a block that normalises q and k per head before RoPE (qwen3), their RMSNorm weights nq
// and nk (head_dim,) each, with the block's eps: two arrays more than the shape's weights say
// (qk_norm_given), which sets shape.qk_norm.
//
// x (N, H) or (1, N, H); out has its shape. keys/values (1, kv_heads, capacity, D): the layer's cache buffers, `slots`
// committed rows first; the N new rows are written at [slots, slots + N) and attended with
// the committed ones under the TreeMask (anc, qpos, key_start, window: attention_core.h's
// contract; qpos are also the RoPE positions). keys'/values' are the buffers with those rows:
// the operation itself returns the rows, (1, kv_heads, N, D), and MLX's slice update puts them
// in, in place when the buffer is the cache's alone. The biases are empty arrays when
// the block has none. Every step is the ops' own (rope_norm.h, dispatch.h, attention_core.h),
// row by row, so a row's result does not depend on the rows computed with it; the pure-MLX
// twin is the FusedBlock path of edgespec/kernels/fused_block.py.
//
// shape.dual: the EAGLE-3 head's layer instead (heads/eagle3.py). x is then (N, 2 hidden), an
// embedding and a hidden state side by side; n1 (2 hidden,) holds the two halves' own norm
// weights and each half is normalised on its own; q|k|v reads the 2 hidden normalised values;
// the residual after attention is the hidden-state half. Everything after is the same
// (out (N, hidden)). Its twin is Eagle3Head.step's module path.
#pragma once

#include <optional>
#include <vector>

#include "mlx/array.h"
#include "mlx/primitives.h"

namespace edgespec_native {

namespace mx = mlx::core;

struct BlockShape {
  int hidden, heads, kv_heads, head_dim, intermediate, rope_dims;
  bool traditional;
  float mscale, rope_scale, eps, attn_scale;
  // Per product (q|k|v, o, gate|up, down): {group size, bits, symmetric} in MLX's affine
  // layout, or {0, 0, 0} for float32 weights; symmetric: every bias is -2^(bits - 1) times its
  // scale (quantized_matmul.h). q8: the quantized products take int8 activations.
  int quant[4][3];
  bool q8;
  bool dual = false;  // the EAGLE-3 layer (above)
  // q and k normalised per head before RoPE (RMSNorm over head_dim with eps, weights nq and nk
  // after the products' weights: qwen3's attention); set from the inputs' count (qk_norm_given)
  bool qk_norm = false;
  // Gemma's sandwich block: the attention's and the MLP's outputs each RMS-normalised (weights
  // n3 and n4, after the q/k norm weights) before their residual add, n2 the norm before the
  // MLP, and tanh-GELU(gate) * up in place of SiLU. Norm weights arrive as the factors the rows
  // are scaled by (Gemma's 1 + w, made by the caller).
  bool sandwich = false;
  // attention scores capped to softcap * tanh(s / softcap) before the mask (Gemma 2); 0: none
  float softcap = 0.0f;
  bool operator==(const BlockShape&) const = default;
};

// One sequence of a forward over several (decoder_block_many): its rows (consecutive, in
// order), its cache's committed rows, and its TreeMask's key_start and window (0: none).
struct SegmentSpec {
  int64_t rows, slots, key_start, window;
  bool operator==(const SegmentSpec&) const = default;
};

// Raises std::invalid_argument (ValueError in Python) for other dtypes or shapes. One segment:
// the single-sequence op above. Several: arrays continue after the weights with the keys and
// values of sequences 2, 3, ...; anc and qpos hold every row's, each sequence's tree bits
// relative to its own first row; the result is (out, keys_1', values_1', keys_2', ...). The
// operation returns each sequence's new rows as outputs of their own, (1, kv_heads, n_g, D),
// so each slice update takes its sequence's rows without a slice of a shared output first; the
// sequences' attention runs as one pool job (run_tree_attention_many).
// Whether `count` inputs (x and everything after it, `sequences` of them) hold the q/k norm
// weights after the products' weights (two arrays more than shape `s` without them takes).
bool qk_norm_given(const BlockShape& s, size_t count, size_t sequences);

std::vector<mx::array> decoder_block_op(const std::vector<mx::array>& arrays,
                                        const BlockShape& shape,
                                        const std::vector<SegmentSpec>& segs);

// A model's blocks run in turn over one sequence's rows, each as decoder_block_op: the same
// operations and bits as one call per layer, built by one call. Each layer's arrays after x,
// keys, values, anc and qpos (inv_freq, n1, n2, bqkv, bgu, bd, weights...) and its shape are
// held from construction, so a forward converts only what changes (x and the caches). For
// `layers` entries: keys/values the layer's cache buffers, anc/qpos its TreeMask's arrays,
// slots/key_starts/windows its SegmentSpec. Returns the last block's out, each layer's keys'
// and values', and x as it enters each layer listed in `capture` (increasing; the layer count
// itself: the last out). `in_place` (the caller gives the buffers up: nothing else holds or
// views them) lets DecoderBlocks write the rows into the buffers given; keys' and values' are
// then empty (the buffers are the ones given, changed by the task that makes out, so whatever
// reads them must come after out), which happens where the layers share one key/value shape
// and no buffer is given twice. `after`: arrays the operation waits for and does not read (the
// previous in-place forward's out).
struct StackOut {
  mx::array out;
  std::vector<mx::array> keys, values, captured;
};

// A stack layer's block inputs as decoder_block_op takes them (x, keys, values, anc, qpos,
// the layer's arguments, then the other sequences' keys and values), read where they are: a
// stack forward checks every layer without copying its arrays into a list.
struct LayerInputs {
  const mx::array* head[5];  // x, keys, values, anc, qpos
  const std::vector<mx::array>* args;
  std::vector<const mx::array*> more;  // the other sequences' keys and values, in turn

  size_t size() const { return 5 + args->size() + more.size(); }
  const mx::array& operator[](size_t i) const {
    return i < 5 ? *head[i] : i < 5 + args->size() ? (*args)[i - 5] : *more[i - 5 - args->size()];
  }
};

// Each layer's constant block arguments (inv_freq, n1, n2, bqkv, bgu, bd, its weights), shared
// by a DecoderStack and the operations and tasks it makes.
using LayerArgs = std::shared_ptr<const std::vector<std::vector<mx::array>>>;

class DecoderStack {
 public:
  DecoderStack(std::vector<std::vector<mx::array>> layer_args, std::vector<BlockShape> shapes);
  StackOut forward(const mx::array& x, const std::vector<mx::array>& keys,
                   const std::vector<mx::array>& values, const std::vector<mx::array>& anc,
                   const std::vector<mx::array>& qpos, const std::vector<int64_t>& slots,
                   const std::vector<int64_t>& key_starts, const std::vector<int64_t>& windows,
                   bool q8, const std::vector<int>& capture, bool in_place = false,
                   const std::vector<mx::array>& after = {}) const;
  // Several sequences' rows at once, each over its own caches (x holds sequence 0's rows[0]
  // rows, then sequence 1's, ...; anc and qpos hold every row's, each sequence's tree bits
  // relative to its own first row, as decoder_block_op takes them; keys[g][i], values[g][i]
  // and slots[g][i]: sequence g's layer i), every row with the bits its sequence gets alone.
  // In place only: the caller gives every buffer up, and the rows go straight into them (read
  // after out, as forward's in place). Returns out, with x as it entered each layer of
  // `capture` appended to `captured`; or nothing where the layers differ in key/value shape
  // or an array is given twice (the caller then runs one decoder_block_op a layer).
  std::optional<mx::array> forward_many(
      const mx::array& x, const std::vector<std::vector<mx::array>>& keys,
      const std::vector<std::vector<mx::array>>& values, const mx::array& anc,
      const mx::array& qpos, const std::vector<int64_t>& rows,
      const std::vector<std::vector<int64_t>>& slots, const std::vector<int64_t>& key_starts,
      const std::vector<int64_t>& windows, bool q8, const std::vector<int>& capture,
      const std::vector<mx::array>& after, std::vector<mx::array>* captured) const;
  size_t layers() const { return shapes_.size(); }

 private:
  std::vector<BlockShape> q8_shapes(bool q8) const;  // int8 activations for quantized layers
  bool alike() const;  // one key/value shape for every layer
  void check_capture(const std::vector<int>& capture) const;  // increasing ids, 0 .. layers
  // The layers as one DecoderBlocks operation over `blocks` (each layer's block inputs, x
  // first; each checked as its own block checks them), after `after`; `st` becomes the stream
  // it runs on. Returns its outputs (out; unless in place every layer's new rows, (2 layers,
  // kv_heads, rows, head_dim); then x as it enters each layer of `capture` inside the stack)
  // and appends to `captured` x as it enters each layer of `capture` (the layer count: out).
  std::vector<mx::array> blocks_op(const std::vector<LayerInputs>& blocks,
                                   const std::vector<BlockShape>& shapes,
                                   const std::vector<std::vector<SegmentSpec>>& segs,
                                   const std::vector<int>& capture, bool in_place,
                                   const std::vector<mx::array>& after,
                                   std::vector<mx::array>& captured, mx::Stream& st) const;

  // Each layer's arguments, evaluated at construction: the operations hold them (shared), not
  // as graph inputs, so a forward neither copies nor schedules every layer's constant arrays.
  LayerArgs args_;
  std::vector<BlockShape> shapes_;
};

// A DecoderStack forward's blocks as one operation and one task on the stream: the same bits
// as one DecoderBlock a layer, without MLX scheduling 30 operations and releasing their inputs
// between the blocks. Inputs: x, then each layer's keys, values, anc and qpos (then, over
// several sequences, the other sequences' keys and values), then the `after` arrays (not read).
// Each layer's constant arguments (inv_freq, n1, n2, bqkv, bgu, bd, its weights) are held by
// the operation and its task (`args`: the stack's, evaluated), not given as inputs: MLX walks,
// copies and keeps alive every input of every evaluation on the host thread, which for all the
// layers' weights cost more a forward than the rest of the operation's set-up.
// Outputs: the last block's output; unless in place, every layer's new keys and values in one
// array (2 layers, kv_heads, rows, head_dim: layer i's keys at 2i, values at 2i + 1; one array,
// because MLX holds an operation's inputs once per output), which 2 x layers slices and slice
// updates put in the caches; then the hidden state before each layer of `capture` (inside the
// stack: 0 < c < layers). In place, the rows are written straight into the cache buffers given
// (DecoderStack::forward's contract), which saves those 120 operations a forward. Layers must
// share their key/value shape (DecoderStack runs one DecoderBlock a layer otherwise).
class DecoderBlocks : public mx::Primitive {
 public:
  DecoderBlocks(mx::Stream stream, std::vector<BlockShape> shapes,
                std::vector<std::vector<SegmentSpec>> segs, std::vector<int> capture,
                bool in_place, LayerArgs args)
      : mx::Primitive(stream), shapes_(std::move(shapes)), segs_(std::move(segs)),
        capture_(std::move(capture)), in_place_(in_place), args_(std::move(args)) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "EdgespecDecoderBlocks"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  std::vector<BlockShape> shapes_;
  std::vector<std::vector<SegmentSpec>> segs_;  // per layer, one per sequence
  std::vector<int> capture_;
  bool in_place_;
  LayerArgs args_;
};

// How many cache buffers DecoderBlocks has copied before writing into them in place, since
// the module loaded (one given twice, or strided: own_buffer in block.cpp).
int64_t decoder_blocks_copies();

class DecoderBlock : public mx::Primitive {
 public:
  DecoderBlock(mx::Stream stream, BlockShape shape, std::vector<SegmentSpec> segs)
      : mx::Primitive(stream), shape_(shape), segs_(std::move(segs)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;

  const char* name() const override { return "EdgespecDecoderBlock"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  BlockShape shape_;
  std::vector<SegmentSpec> segs_;
};

}  // namespace edgespec_native
