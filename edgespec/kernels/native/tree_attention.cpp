// See tree_attention.h.
#include "tree_attention.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "attention_core.h"
#include "dispatch.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "pool.h"

namespace edgespec_native {

namespace {

// The message is a literal, so that a check that holds allocates nothing.
void check(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("tree_attention: ") + what);
}

// Below this many multiply-adds (a decode step over a few hundred keys) one thread does it.
constexpr int64_t kThreadedMinWork = 256 * 1024;
// With the helpers awake, one thread only below this many multiply-adds (a few dozen keys).
constexpr int64_t kAwakeMinWork = 16 * 1024;

// Items a chunk (the AVX-512 and AVX2 code attends to up to kTileQueries of one kv head at
// once, reading each block of key and value rows once for them) and the scratch rows a chunk
// needs.
constexpr int64_t kItemsPerChunk = kTileQueries, kScratchRows = kTileQueries;

using AttnFn = void (*)(const AttnArgs&, float*, int64_t, int64_t);

AttnFn attn_fn() {
#if defined(__x86_64__) || defined(_M_X64)
  const std::string name = isa();
  if (name == "avx512") return attn_items_avx512;
  if (name == "avx2") return attn_items_avx2;
#endif
  return attn_items_generic;
}

// Whether fn attends to several items of a kv head at once for these arguments.
bool tiled(AttnFn fn, const AttnArgs& a) {
#if defined(__x86_64__) || defined(_M_X64)
  return (fn == attn_items_avx512 || fn == attn_items_avx2) && tiles_apply(a);
#else
  return false;
#endif
}

// How one call's items are split into chunks: the arguments as attended (a window that hides
// no key dropped), the function, the scratch rows a chunk needs, and the chunking.
struct AttnPlan {
  AttnFn fn;
  AttnArgs args;
  int64_t items, rows, per_chunk, chunks;
};

AttnPlan plan_attention(const AttnArgs& given, bool helpers_awake) {
  // A window that hides no key is no window: no distance between a node and a key it may see
  // exceeds the span from the earliest position (cached key 0's, or a node's) to the latest.
  // So a sliding-window layer whose context still fits its window (Gemma 3's 512) takes the
  // paths that need no window (runs of 16 keys, tiles), with the same bits: the same keys are
  // seen.
  AttnArgs args = given;
  if (args.window > 0) {  // every distance seen is at most the last position minus the first
    int64_t last = args.key_start, first = args.key_start;
    for (int64_t i = 0; i < args.N; ++i) {
      last = args.qpos[i] > last ? args.qpos[i] : last;
      first = args.qpos[i] < first ? args.qpos[i] : first;
    }
    if (last - first < args.window) args.window = 0;
  }
  const AttnFn fn = attn_fn();
  const int64_t items = args.H * args.N;
  const int64_t rows = tiled(fn, args) ? kScratchRows : 1;  // scratch rows a chunk needs
  // Waking a sleeping helper costs more than a small job; one still polling does not (measured
  // on a decode step's attention inside the block: docs/measurements.md).
  if (items * args.S * args.D < (helpers_awake ? kAwakeMinWork : kThreadedMinWork))
    return {fn, args, items, rows, items, 1};
  // A chunk is up to kItemsPerChunk items, no more than a kv head's (rep * N), and small enough
  // that there are two chunks a thread, so that a decode step's chunks are its kv heads' tiles:
  // the demo model's 9 heads over 3 kv heads go as 3 chunks of 3, which split 2 / 1 over 2
  // threads but read each key and value row once per kv head instead of once per head (faster
  // on long contexts; before the tiles, one item a chunk was: docs/measurements.md, the
  // attention kernel's query tiles). Without tiles (the generic code, a window, a softcap),
  // one item a chunk.
  const int64_t per_head = args.N * (args.H / args.Hkv);
  const int64_t two_a_thread = (items + 2 * Pool::get().threads() - 1) / (2 * Pool::get().threads());
  int64_t per_chunk = kItemsPerChunk < per_head ? kItemsPerChunk : per_head;
  per_chunk = per_chunk < two_a_thread ? per_chunk : two_a_thread;
  if (!tiled(fn, args) || per_chunk < 1) per_chunk = 1;
  if ((items + per_chunk - 1) / per_chunk > Pool::kMaxChunks)
    per_chunk = (items + Pool::kMaxChunks - 1) / Pool::kMaxChunks;
  return {fn, args, items, rows, per_chunk, (items + per_chunk - 1) / per_chunk};
}

// Several calls' chunks as one pool job: chunk c belongs to the plan whose range of chunk
// numbers holds it, and attends to the items, with the scratch, of that plan's own chunk.
struct ManyJob {
  const std::vector<AttnPlan>* plans;
  std::vector<int64_t> first;  // each plan's first chunk number, then the total
  std::vector<float*> scratch;  // each plan's scratch (rows * S floats per chunk)
};

void run_many_chunk(void* ctx, int64_t chunk) {
  const ManyJob& j = *static_cast<const ManyJob*>(ctx);
  size_t p = 0;
  while (j.first[p + 1] <= chunk) ++p;
  const AttnPlan& pl = (*j.plans)[p];
  const int64_t c = chunk - j.first[p], a = c * pl.per_chunk;
  const int64_t b = a + pl.per_chunk < pl.items ? a + pl.per_chunk : pl.items;
  pl.fn(pl.args, j.scratch[p] + c * pl.rows * pl.args.S, a, b);
}

}  // namespace

void run_tree_attention(const AttnArgs& args, bool helpers_awake) {
  run_tree_attention_many({args}, helpers_awake);
}

void run_tree_attention_many(const std::vector<AttnArgs>& calls, bool helpers_awake) {
  std::vector<AttnPlan> plans;
  plans.reserve(calls.size());
  ManyJob job{&plans, {0}, {}};
  std::vector<int64_t> offsets;  // each plan's scratch, in floats from the start
  int64_t floats = 0;
  for (const AttnArgs& a : calls) {
    plans.push_back(plan_attention(a, helpers_awake));
    const AttnPlan& pl = plans.back();
    job.first.push_back(job.first.back() + pl.chunks);
    offsets.push_back(floats);
    floats += pl.chunks * pl.rows * pl.args.S;
  }
  std::vector<float> scratch(static_cast<size_t>(floats));
  for (int64_t at : offsets) job.scratch.push_back(scratch.data() + at);
  if (job.first.back() == 1) {  // one small call: this thread, no pool job
    const AttnPlan& pl = plans[0];
    pl.fn(pl.args, scratch.data(), 0, pl.items);
    return;
  }
  Pool::get().run(run_many_chunk, &job, job.first.back());
}

mx::array tree_attention_op(const mx::array& q, const mx::array& k, const mx::array& v,
                            const mx::array& anc, const mx::array& qpos, int64_t key_start,
                            int64_t window, float scale, float softcap) {
  check(q.dtype() == mx::float32 && k.dtype() == mx::float32 && v.dtype() == mx::float32,
        "q, k and v must be float32");
  check(anc.dtype() == mx::uint32 && qpos.dtype() == mx::int32, "anc uint32 and qpos int32");
  check(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4 && q.shape(0) == 1 && k.shape(0) == 1 &&
            k.shape() == v.shape(),
        "need q (1, H, N, D) and k, v (1, H_kv, S, D) of one shape");
  const int H = q.shape(1), N = q.shape(2), D = q.shape(3), Hkv = k.shape(1), S = k.shape(2);
  check(k.shape(3) == D && D <= 256 && Hkv > 0 && H % Hkv == 0, "D <= 256 and H a multiple of H_kv");
  check(N >= 1 && N <= 64 && S >= N, "1..64 nodes and at least as many keys");
  check(anc.ndim() == 2 && anc.shape(0) == N && anc.shape(1) == 2 && qpos.ndim() == 1 &&
            qpos.shape(0) == N,
        "anc (N, 2) and qpos (N,)");
  auto s = mx::to_stream(mx::StreamOrDevice{});
  if (s.device.type != mx::Device::cpu) s = mx::to_stream(mx::Device::cpu);
  return mx::array({1, H, N, D}, mx::float32,
                   std::make_shared<TreeAttention>(s, key_start, window, scale, softcap),
                   {q, k, v, mx::contiguous(anc, false, s), mx::contiguous(qpos, false, s)});
}

std::vector<mx::Shape> TreeAttention::output_shapes(const std::vector<mx::array>& in) {
  return {in[0].shape()};
}

bool TreeAttention::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const TreeAttention&>(other);
  return key_start_ == o.key_start_ && window_ == o.window_ && scale_ == o.scale_ &&
         softcap_ == o.softcap_;
}

void TreeAttention::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto &q = inputs[0], &k = inputs[1], &v = inputs[2], &anc = inputs[3], &qpos = inputs[4];
  for (const auto* a : {&q, &k, &v})
    if (a->strides()[3] != 1 && a->shape(3) > 1)
      throw std::invalid_argument("tree_attention: the last axis of q, k, v must be contiguous");
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);
  AttnArgs args{q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                anc.data<uint32_t>(), qpos.data<int32_t>(),
                q.shape(2), k.shape(2), k.shape(2) - q.shape(2), q.shape(1), k.shape(1),
                q.shape(3), key_start_, window_, scale_, softcap_,
                int64_t(q.strides()[1]), int64_t(q.strides()[2]), int64_t(k.strides()[1]),
                int64_t(k.strides()[2]), int64_t(v.strides()[1]), int64_t(v.strides()[2])};
  encoder.dispatch([args]() { run_tree_attention(args); });
}

void TreeAttention::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("EdgespecTreeAttention has no GPU form (the Metal kernel is "
                           "kernels_metal/tree_attention.metal)");
}

}  // namespace edgespec_native
