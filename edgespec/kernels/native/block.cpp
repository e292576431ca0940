// See block.h.
#include "block.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

#include "aligned_room.h"
#include "attention_core.h"
#include "dispatch.h"
#include "exp_neg.h"
#include "expf_libm.h"
#include "pool.h"
#include "quantized_matmul.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "rope_norm.h"
#include "tree_attention.h"

namespace edgespec_native {

namespace {

// Inputs: these, then the four products' weights (QKV, O, GU, D): one float array each, or
// (packed, scales, biases) where the block is quantized.
enum Input { X, KEYS, VALUES, ANC, QPOS, INV_FREQ, N1, N2, BQKV, BGU, BD, WEIGHTS };
enum Product { QKV, O, GU, DOWN };

// A literal message takes the const char* form, so that a check that holds allocates nothing
// (a forward makes several a layer).
void check(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("decoder_block: ") + what);
}

void check(bool ok, const std::string& what) { check(ok, what.c_str()); }

bool row_contiguous_2d(const mx::array& a, int rows, int cols) {
  return a.ndim() == 2 && a.shape(0) == rows && a.shape(1) == cols && a.flags().row_contiguous;
}

// One product's weights: float rows w (N, K), or MLX's affine packing (wq, scales, biases).
struct Weights {
  const float* w = nullptr;
  const uint32_t* wq = nullptr;
  const void *scales = nullptr, *biases = nullptr;  // float32, or float16 where half
  bool half = false;
  int group_size = 0, bits = 0;
  bool symmetric = false;  // every bias -2^(bits - 1) times its scale (quantized_matmul.h)
};

// One sequence's rows of a forward: rows [row0, row0 + n) of x attend to this cache (read
// only: head h, row t at h * X_h + t * X_t, `slots` committed rows) and to each other under
// the TreeMask rows anc/qpos [row0, row0 + n) (key_start, window).
struct Segment {
  int64_t row0, n, slots, key_start, window;
  const float *keys, *values;
  int64_t k_h, k_t, v_h, v_t;
};

struct BlockJob {
  BlockShape s;
  int64_t N;
  bool q8;
  const float *x, *inv_freq, *n1, *n2, *bqkv, *bgu, *bd;
  Weights w[4];
  const float *nq, *nk;  // q/k norm weights (head_dim,), or null: none
  const float *n3, *n4;  // the sandwich block's post-attention and post-MLP norms, or null
  const uint32_t* anc;
  const int32_t* qpos;
  std::vector<Segment> segs;  // in row order, covering [0, N)
  float* out;  // (N, H)
  // Each sequence's new keys and values, (kv_heads, n, D) each: one sequence's are written as
  // they are computed; several sequences' go through the forward's own (kv_heads, N, D) rows
  // and are copied out at the end (one output per sequence: MLX then puts each in its cache
  // without slicing a shared output first).
  std::vector<float*> k_out, v_out;
};

// y (M, N) = x (M, K) @ W.T
void product(const Weights& w, bool q8, const float* x, int64_t M, int64_t K, float* y,
             int64_t N) {
  if (w.w != nullptr) return small_matmul(x, K, w.w, K, y, N, M, N, K);
  quantized_small_matmul(x, K, w.wq, w.scales, w.biases, w.half, y, N, M, N, K, w.group_size,
                         w.bits, q8, w.symmetric);
}

void add_bias(float* y, const float* b, int64_t rows, int64_t n) {
  if (b == nullptr) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) y[r * n + i] += b[i];
}

// act[c] = SiLU(gu[c]) * gu[I + c] for c < n (gate | up side by side, I apart), the float
// forward's form. The sigmoid takes e = e^-|gate| <= 1 (exp_neg.h; no overflow): 1 / (1 + e)
// for gate >= 0, e / (1 + e) below, with e exactly 0 below -87.3, where exp_neg stops at
// 2^-126 (which a huge negative gate would turn into -1.18 up). On x86-64 Linux it is compiled
// once per ISA (function multiversioning picks the widest the CPU has at load time; elsewhere
// it is compiled once, for the build's target). Each element's result depends on that element
// alone, so a row's bits do not depend on the rows beside it.
#if (defined(__x86_64__) || defined(_M_X64)) && defined(__linux__)  // clones need ELF ifuncs
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void silu_mul(const float* __restrict gu, int64_t I, int64_t n, float* __restrict act) {
  for (int64_t c = 0; c < n; ++c) {
    const float gate = gu[c], up = gu[I + c];
    const float ng = gate < 0.0f ? gate : -gate;
    const float e = ng * 1.44269504088896341f < -126.0f ? 0.0f : exp_neg(ng);
    const float sig = (gate < 0.0f ? e : 1.0f) / (1.0f + e);
    act[c] = gate * sig * up;
  }
}

// The int8-activation forward's SiLU, gate / (1 + e^-gate) * up with libm's exp (expf_libm.h's
// silu_libm): down_proj then rounds every value to 8 bits, and the twin's exp is libm's, so an
// approximate one would flip a few roundings. In chunks of kSiluCols columns of a row, on the
// pool's threads when there are many.
constexpr int64_t kSiluCols = 512;
// Below this many values one thread does them all: the vector exp is cheaper than a pool job.
constexpr int64_t kSiluInline = 8192;

struct SiluJob {
  const float* gu;
  float* act;
  int64_t I, per_row;  // per_row: chunks a row has
};

void run_silu_chunk(void* ctx, int64_t chunk) {
  const SiluJob& j = *static_cast<const SiluJob*>(ctx);
  const int64_t row = chunk / j.per_row, c0 = chunk % j.per_row * kSiluCols;
  const int64_t n = j.I - c0 < kSiluCols ? j.I - c0 : kSiluCols;
  const float* gu = j.gu + row * 2 * j.I + c0;
  silu_libm(gu, gu + j.I, j.act + row * j.I + c0, n);
}

// act[c] = tanh-GELU(gu[c]) * gu[I + c] for c < n: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715
// g^3))) times up, Gemma's activation (MLX's gelu_approx), with libm's tanh. Each element's
// result depends on that element alone.
void gelu_tanh_mul(const float* __restrict gu, int64_t I, int64_t n, float* __restrict act) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  for (int64_t c = 0; c < n; ++c) {
    const float g = gu[c];
    act[c] = 0.5f * g * (1.0f + std::tanh(k * (g + 0.044715f * (g * g * g)))) * gu[I + c];
  }
}

void run_gelu_chunk(void* ctx, int64_t chunk) {
  const SiluJob& j = *static_cast<const SiluJob*>(ctx);
  const int64_t row = chunk / j.per_row, c0 = chunk % j.per_row * kSiluCols;
  const int64_t n = j.I - c0 < kSiluCols ? j.I - c0 : kSiluCols;
  gelu_tanh_mul(j.gu + row * 2 * j.I + c0, j.I, n, j.act + row * j.I + c0);
}

void run_block(const BlockJob& j) {
  const BlockShape& s = j.s;
  const int64_t N = j.N, H = s.hidden, D = s.head_dim, I = s.intermediate;
  const int64_t nq = s.heads * D, nqkv = (s.heads + 2 * s.kv_heads) * D;
  const int64_t K = s.dual ? 2 * H : H;  // x's width: what q|k|v reads
  // The intermediates, carved from one buffer per thread that only grows: allocating and
  // zeroing ~0.5 MB a layer at 16 tokens cost ~3% of a forward.
  thread_local std::vector<float> scratch;
  const bool split = j.segs.size() > 1;  // the new keys/values in scratch, copied out per sequence
  const int64_t kv_rows = split ? s.kv_heads * N * D : 0;
  const int64_t sizes[10] = {N * K,  N * nqkv,  N * nq,     N * nq, N * nq,
                             N * H,  N * 2 * I, N * I,      kv_rows, kv_rows};
  int64_t total = 0;
  for (int64_t n : sizes) total += (n + 15) / 16 * 16;  // each part 64-byte aligned from the start
  float* part[10];
  float* at = aligned_room(scratch, total);
  for (int i = 0; i < 10; ++i) {
    part[i] = at;
    at += (sizes[i] + 15) / 16 * 16;
  }
  float *xn = part[0], *y = part[1], *q = part[2], *attn = part[3], *attn_rows = part[4],
        *hdn = part[5], *g = part[6], *act = part[7];
  // Where the new keys/values go, head h of row m at h * k_rh + m * k_rt: the forward's own
  // rows (kv_heads, N, D), or, for one sequence whose k_out is null, its cache's buffer from
  // row `slots` on (DecoderBlocks writes the caches in place).
  const bool in_cache = !split && j.k_out[0] == nullptr;
  const Segment& g0 = j.segs[0];
  float* k_rows = split ? part[8] : in_cache ? const_cast<float*>(g0.keys) + g0.slots * g0.k_t
                                              : j.k_out[0];
  float* v_rows = split ? part[9] : in_cache ? const_cast<float*>(g0.values) + g0.slots * g0.v_t
                                              : j.v_out[0];
  const int64_t k_rh = in_cache ? g0.k_h : N * D, k_rt = in_cache ? g0.k_t : D;
  const int64_t v_rh = in_cache ? g0.v_h : N * D, v_rt = in_cache ? g0.v_t : D;
  // input norm, q|k|v
  if (s.dual) {  // the embedding half and the hidden half, each with its own norm
    rms_rows(j.x, K, j.n1, xn, K, N, H, s.eps);
    rms_rows(j.x + H, K, j.n1 + H, xn + H, K, N, H, s.eps);
  } else {
    rms_rows(j.x, H, j.n1, xn, H, N, H, s.eps);
  }
  product(j.w[QKV], j.q8, xn, N, K, y, nqkv);
  add_bias(y, j.bqkv, N, nqkv);
  if (j.nq != nullptr)  // q and k per head, in place: each head's D values of each row
    for (int64_t i = 0; i < N; ++i) {
      float* row = y + i * nqkv;
      rms_rows(row, D, j.nq, row, D, s.heads, D, s.eps);
      rms_rows(row + nq, D, j.nk, row + nq, D, s.kv_heads, D, s.eps);
    }
  // RoPE; k and v into this forward's rows
  RopeArgs r{y, nqkv, j.qpos, true, j.inv_freq, q, k_rows, v_rows, N * D, D, k_rh, k_rt,
             v_rh, v_rt, N, s.heads, s.kv_heads, D, s.rope_dims, s.traditional, s.mscale,
             s.rope_scale};
  qkv_rope_rows(r);
  // attention, each sequence over its committed rows (its cache) and its new ones, all
  // sequences in one pool job; a segment's output is (heads, n, D) at attn + row0 * nq
  std::vector<AttnArgs> calls;
  calls.reserve(j.segs.size());
  for (const Segment& g : j.segs) {
    const int64_t n = g.n, at = g.row0;
    calls.push_back({q + at * D, g.keys, g.values, attn + at * nq, j.anc + 2 * at, j.qpos + at,
                     n, g.slots + n, g.slots, s.heads, s.kv_heads, D, g.key_start, g.window,
                     s.attn_scale, s.softcap, N * D, D, g.k_h, g.k_t, g.v_h, g.v_t,
                     k_rows + at * k_rt, v_rows + at * v_rt, k_rh, k_rt, v_rh, v_rt});
  }
  run_tree_attention_many(calls, true);
  for (const Segment& g : j.segs) {
    const int64_t n = g.n, at = g.row0;
    const float* seg_attn = attn + at * nq;
    for (int64_t h = 0; h < s.heads; ++h)  // (heads, n, D) -> (n, heads * D)
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(attn_rows + (at + i) * nq + h * D, seg_attn + (h * n + i) * D,
                    D * sizeof(float));
  }
  // each sequence's keys/values out: to its outputs, or (k_out null: DecoderBlocks writing in
  // place) into its cache buffers from row `slots` on, each row where its attention read it
  for (size_t i = 0; split && i < j.segs.size(); ++i) {
    const Segment& g = j.segs[i];
    const size_t bytes = g.n * D * sizeof(float);
    for (int64_t h = 0; h < s.kv_heads; ++h) {
      const float* kr = k_rows + (h * N + g.row0) * D;
      const float* vr = v_rows + (h * N + g.row0) * D;
      if (j.k_out[i] != nullptr) {
        std::memcpy(j.k_out[i] + h * g.n * D, kr, bytes);
        std::memcpy(j.v_out[i] + h * g.n * D, vr, bytes);
        continue;
      }
      float* kc = const_cast<float*>(g.keys) + h * g.k_h + g.slots * g.k_t;
      float* vc = const_cast<float*>(g.values) + h * g.v_h + g.slots * g.v_t;
      for (int64_t m = 0; m < g.n; ++m) {
        std::memcpy(kc + m * g.k_t, kr + m * D, D * sizeof(float));
        std::memcpy(vc + m * g.v_t, vr + m * D, D * sizeof(float));
      }
    }
  }
  // o_proj (normalised in the sandwich block) and the residual
  product(j.w[O], j.q8, attn_rows, N, nq, hdn, H);
  if (j.n3 != nullptr) rms_rows(hdn, H, j.n3, hdn, H, N, H, s.eps);
  const float* res = j.x + (K - H);  // the residual: x, or x's hidden half (dual)
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < H; ++c) hdn[i * H + c] += res[i * K + c];
  // post-attention norm, gate|up, SiLU(gate) * up, down, residual
  rms_rows(hdn, H, j.n2, xn, H, N, H, s.eps);
  product(j.w[GU], j.q8, xn, N, H, g, 2 * I);
  add_bias(g, j.bgu, N, 2 * I);
  if (s.sandwich) {  // tanh-GELU, the same code with float or int8 x
    SiluJob gelu{g, act, I, (I + kSiluCols - 1) / kSiluCols};
    if (N * I <= kSiluInline) {
      for (int64_t c = 0; c < N * gelu.per_row; ++c) run_gelu_chunk(&gelu, c);
    } else {
      Pool::get().run(run_gelu_chunk, &gelu, N * gelu.per_row);
    }
  } else if (j.q8) {
    SiluJob silu{g, act, I, (I + kSiluCols - 1) / kSiluCols};
    if (N * I <= kSiluInline) {
      for (int64_t c = 0; c < N * silu.per_row; ++c) run_silu_chunk(&silu, c);
    } else {
      Pool::get().run(run_silu_chunk, &silu, N * silu.per_row);
    }
  } else {  // the vectorized exp is cheaper than waking a helper
    for (int64_t i = 0; i < N; ++i) silu_mul(g + i * 2 * I, I, I, act + i * I);
  }
  product(j.w[DOWN], j.q8, act, N, I, j.out, H);
  add_bias(j.out, j.bd, N, H);
  if (j.n4 != nullptr) rms_rows(j.out, H, j.n4, j.out, H, N, H, s.eps);
  for (int64_t i = 0; i < N * H; ++i) j.out[i] += hdn[i];
}

// A row-contiguous copy of a 4-byte-element array given as a strided view, made by a task on
// the stream (its data is ready only there).
mx::array row_contiguous_copy(const mx::array& in, mx::cpu::CommandEncoder& encoder) {
  mx::array out(in.shape(), in.dtype(), nullptr, {});
  out.set_data(mx::allocator::malloc(out.nbytes()));
  encoder.dispatch([src = static_cast<const uint32_t*>(in.data<void>()),
                    dst = out.data<uint32_t>(), shape = in.shape(), strides = in.strides(),
                    n = int64_t(in.size())]() {
    for (int64_t e = 0; e < n; ++e) {
      int64_t rest = e, at = 0;
      for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
        at += rest % shape[d] * strides[d];
        rest /= shape[d];
      }
      dst[e] = src[at];
    }
  });
  return out;
}

}  // namespace

namespace {

// Whether expf_avx2 gives std::exp's bits on this machine: the CPU has AVX2 and FMA, and
// every 65,537th float bit pattern below 88 in magnitude (about 32,000 values of every sign
// and scale) comes out equal, with the two inputs where glibc's algorithm without fused
// multiply-adds (its non-FMA build, musl's) rounds differently from the fused one
// (scripts/expf_exhaustive.sh finds them), checked once, when the module loads (bindings.cpp).
bool check_vector_expf() {
#if defined(__x86_64__) || defined(_M_X64)
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return false;
  std::vector<float> x, y;
  for (const uint32_t u : {0x427c65d9u, 0xc202422fu, 0u, 0u}) {  // padded to a vector of 4
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 65537) {
    const uint32_t u = static_cast<uint32_t>(b);
    if (((u >> 20) & 0x7ff) >= 0x42b) continue;  // |x| >= 88, NaN, infinity: std::exp's
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  x.resize(x.size() - x.size() % 4);
  y.resize(x.size());
  expf_avx2(x.data(), y.data(), static_cast<int64_t>(x.size()), true);
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = std::exp(-x[i]);
    if (std::memcmp(&y[i], &want, 4) != 0) return false;
  }
  return true;
#else
  return false;
#endif
}

}  // namespace

bool expf_vector_active() {
  static const bool active = check_vector_expf();
  return active;
}

void exp_neg_libm(const float* x, float* y, int64_t n) {
  int64_t done = 0;
#if defined(__x86_64__) || defined(_M_X64)
  if (expf_vector_active()) {
    done = n - n % 4;
    expf_avx2(x, y, done, true);
    for (int64_t i = 0; i < done; ++i) {  // |x| >= 88, NaN, infinity: libm's own answer
      uint32_t u;
      std::memcpy(&u, x + i, 4);
      if (((u >> 20) & 0x7ff) >= 0x42b) y[i] = std::exp(-x[i]);
    }
  }
#endif
  for (int64_t i = done; i < n; ++i) y[i] = std::exp(-x[i]);
}

void silu_libm(const float* gate, const float* up, float* act, int64_t n) {
  const auto one = [&](int64_t i) { act[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i]; };
  int64_t done = 0;
#if defined(__x86_64__) || defined(_M_X64)
  if (expf_vector_active()) {
    done = n - n % 4;
    if (silu_libm_avx2(gate, up, act, done))
      for (int64_t i = 0; i < done; ++i) {  // |gate| >= 88, NaN, infinity: libm's own exp
        uint32_t u;
        std::memcpy(&u, gate + i, 4);
        if (((u >> 20) & 0x7ff) >= 0x42b) one(i);
      }
  }
#endif
  for (int64_t i = done; i < n; ++i) one(i);
}

// How many inputs a block op takes before its second sequence's keys and values.
size_t weights_end_of(const BlockShape& s) {
  size_t end = WEIGHTS;
  for (const auto& q : s.quant) end += q[1] ? 3 : 1;
  return end + (s.qk_norm ? 2 : 0) + (s.sandwich ? 2 : 0);
}

BlockJob block_job(const BlockShape& shape, const std::vector<SegmentSpec>& segs,
                   const std::vector<mx::array>& given, bool x_given,
                   mx::cpu::CommandEncoder& encoder, float* out, std::vector<float*> k_out,
                   std::vector<float*> v_out);

bool qk_norm_given(const BlockShape& s, size_t count, size_t sequences) {
  BlockShape plain = s;
  plain.qk_norm = false;
  return !s.dual && count == weights_end_of(plain) + 2 * (sequences - 1) + 2;
}

// decoder_block_op's checks of its inputs (a list of them, or a LayerInputs); the stream the
// block runs on.
template <typename In>
mx::Stream check_block(const In& in, const BlockShape& s, const std::vector<SegmentSpec>& segs) {
  const int H = s.hidden, D = s.head_dim, I = s.intermediate;
  const int nq = s.heads * D, nqkv = (s.heads + 2 * s.kv_heads) * D;
  const int K = s.dual ? 2 * H : H;  // x's width
  const int rows[4] = {nqkv, H, 2 * I, H}, cols[4] = {K, nq, H, I};
  check(!segs.empty(), "needs at least one sequence");
  const size_t weights_end = weights_end_of(s);
  check(in.size() == weights_end + 2 * (segs.size() - 1),
        "needs x, keys, values, anc, qpos, inv_freq, n1, n2, bqkv, bgu, bd, then each "
        "product's weights (1 float array, or 3 when quantized), the q/k norm weights where "
        "the block has them, a sandwich block's post-attention and post-MLP norm weights, "
        "then keys and values of each sequence after the first");
  const size_t norms_end = weights_end - (s.sandwich ? 2 : 0);  // after the q/k norms
  if (s.qk_norm)
    for (size_t i = norms_end - 2; i < norms_end; ++i)
      check(in[i].dtype() == mx::float32 && in[i].size() == size_t(D),
            "the q/k norm weights must be float32 (head_dim,)");
  check(!s.sandwich || !s.dual, "the EAGLE-3 layer is not a sandwich block");
  check(s.softcap >= 0.0f, "softcap must be 0 (none) or positive");
  if (s.sandwich)
    for (size_t i = norms_end; i < weights_end; ++i)
      check(in[i].dtype() == mx::float32 && in[i].size() == size_t(H),
            "the sandwich block's post-attention and post-MLP norm weights must be float32 "
            "(hidden,)");
  for (int i = 0; i < WEIGHTS; ++i)
    check(in[i].dtype() == (i == ANC ? mx::uint32 : i == QPOS ? mx::int32 : mx::float32),
          "arrays must be float32 (anc uint32, qpos int32)");
  const auto& x = in[X];
  check((x.ndim() == 2 || (x.ndim() == 3 && x.shape(0) == 1)) && x.shape(-1) == K,
        s.dual ? "x must be (N, 2 hidden) or (1, N, 2 hidden) (dual)"
               : "x must be (N, hidden) or (1, N, hidden)");
  const int N = x.shape(-2);
  check(N >= 1 && N <= 64, "1..64 tokens");
  check(D >= 1 && D <= 256, "head_dim 1..256");
  int64_t total = 0;
  for (size_t g = 0; g < segs.size(); ++g) {
    const auto& k = in[g ? weights_end + 2 * (g - 1) : KEYS];
    const auto& v = in[g ? weights_end + 2 * (g - 1) + 1 : VALUES];
    check(k.dtype() == mx::float32 && v.dtype() == mx::float32, "keys/values must be float32");
    check(k.ndim() == 4 && k.shape(0) == 1 && k.shape(1) == s.kv_heads && k.shape(3) == D &&
              v.shape() == k.shape(),
          "keys and values must be (1, kv_heads, capacity, head_dim)");
    check(segs[g].rows >= 1, "every sequence needs at least one row");
    check(segs[g].slots >= 0 && segs[g].slots + segs[g].rows <= k.shape(2),
          "the cache has no room for the new rows");
    total += segs[g].rows;
  }
  check(total == N, "the sequences' rows must add up to x's");
  check(in[ANC].ndim() == 2 && in[ANC].shape(0) == N && in[ANC].shape(1) == 2 &&
            in[QPOS].ndim() == 1 && in[QPOS].shape(0) == N,
        "anc (N, 2) and qpos (N,)");
  check(s.rope_dims % 2 == 0 && s.rope_dims <= D && in[INV_FREQ].size() == size_t(s.rope_dims / 2),
        "inv_freq must have rope_dims / 2 entries");
  check(in[N1].size() == size_t(K) && in[N2].size() == size_t(H),
        "norm weights (hidden,); n1 (2 hidden,) when dual");
  check((in[BQKV].size() == 0 || in[BQKV].size() == size_t(nqkv)) &&
            (in[BGU].size() == 0 || in[BGU].size() == size_t(2 * I)) &&
            (in[BD].size() == 0 || in[BD].size() == size_t(H)),
        "biases must be empty or match their product");
  size_t at = WEIGHTS;
  for (int p = 0; p < 4; ++p) {
    const int gs = s.quant[p][0], bits = s.quant[p][1];
    if (bits == 0) {
      check(in[at].dtype() == mx::float32 && row_contiguous_2d(in[at], rows[p], cols[p]),
            "float weights must be contiguous wqkv ((heads + 2 kv_heads) head_dim, hidden) (2 "
            "hidden when dual), wo "
            "(hidden, heads head_dim), wgu (2 intermediate, hidden), wd (hidden, intermediate)");
      at += 1;
      continue;
    }
    check((bits == 4 || bits == 8) && (gs == 32 || gs == 64 || gs == 128) && cols[p] % gs == 0,
          "quantized products need bits 4 or 8 and group size 32, 64 or 128");
    const auto sdt = in[at + 1].dtype();
    check(in[at].dtype() == mx::uint32 && (sdt == mx::float32 || sdt == mx::float16) &&
              in[at + 2].dtype() == sdt &&
              row_contiguous_2d(in[at], rows[p], cols[p] * bits / 32) &&
              row_contiguous_2d(in[at + 1], rows[p], cols[p] / gs) &&
              row_contiguous_2d(in[at + 2], rows[p], cols[p] / gs),
          "quantized weights must be contiguous uint32 (N, K bits / 32) with scales and "
          "biases (N, K / group size), both float32 or both float16");
    at += 3;
  }
  check(!s.q8 || has_q8_activations(), "int8 activations need AVX-512 VNNI code");
  auto st = mx::to_stream(mx::StreamOrDevice{});
  if (st.device.type != mx::Device::cpu) st = mx::to_stream(mx::Device::cpu);
  return st;
}

namespace {

// `rows` (1, kv_heads, n, head_dim) written into the cache buffer `cache` from row `slots` on,
// by MLX's slice update: in place when the buffer is the cache's alone (the KVCache has let go
// of it, nothing views it), else a copy. A block's own outputs could not write there: MLX holds
// a multi-output operation's inputs once per output, so its inputs are never donatable.
mx::array into_cache(const mx::array& cache, const mx::array& rows, int64_t slots, mx::Stream st) {
  const int at = static_cast<int>(slots);
  const mx::Shape start{0, 0, at, 0}, stop{1, rows.shape(1), at + rows.shape(2), rows.shape(3)};
  return mx::slice_update(cache, rows, start, stop, st);
}

// How many cache buffers DecoderBlocks has copied before writing them (own_buffer).
std::atomic<int64_t> buffer_copies{0};

// Gives `cache` (a float32 cache buffer that DecoderBlocks is about to write in place) a
// row-contiguous buffer of its own holding what it holds (row_contiguous_copy, a task on the
// stream ahead of the blocks'): another buffer given that shares its memory keeps the old one
// unchanged. Only this array takes the new buffer: any other array on the old memory does not
// see the rows (a KVCache never gives such buffers: its layers' buffers are distinct and
// contiguous).
void own_buffer(const mx::array& cache, mx::cpu::CommandEncoder& encoder) {
  ++buffer_copies;
  mx::array old(cache.shape(), cache.dtype(), nullptr, {});
  old.copy_shared_buffer(cache);  // the old memory, held until the copy has run
  encoder.add_temporary(old);
  mx::array fresh = cache;  // the same array: its new buffer is the caller's too
  fresh.copy_shared_buffer(row_contiguous_copy(old, encoder));
}

// Binds an operation's inputs and newly allocated outputs to the stream's command encoder.
void bind_arrays(mx::cpu::CommandEncoder& encoder, const std::vector<mx::array>& inputs,
                 std::vector<mx::array>& outputs) {
  for (const auto& a : inputs) encoder.set_input_array(a);
  for (auto& o : outputs) {
    o.set_data(mx::allocator::malloc(o.nbytes()));
    encoder.set_output_array(o);
  }
}

}  // namespace

std::vector<mx::array> decoder_block_op(const std::vector<mx::array>& in, const BlockShape& s,
                                        const std::vector<SegmentSpec>& segs) {
  const mx::Stream st = check_block(in, s, segs);
  const int H = s.hidden, D = s.head_dim;
  const size_t weights_end = weights_end_of(s);
  // No contiguous() around the small inputs: it adds an operation each (9 a layer) even when
  // they already are; eval_cpu copies any that is not.
  mx::Shape out_shape = in[X].shape();
  out_shape.back() = H;
  std::vector<mx::Shape> shapes{out_shape};
  for (const auto& g : segs)
    for (int kv = 0; kv < 2; ++kv) shapes.push_back({1, s.kv_heads, int(g.rows), D});
  auto outs = mx::array::make_arrays(shapes, std::vector<mx::Dtype>(shapes.size(), mx::float32),
                                     std::make_shared<DecoderBlock>(st, s, segs), in);
  std::vector<mx::array> result{outs[0]};  // the new rows into the caches (into_cache)
  for (size_t g = 0; g < segs.size(); ++g) {
    const size_t ki = g ? weights_end + 2 * (g - 1) : KEYS;
    result.push_back(into_cache(in[ki], outs[1 + 2 * g], segs[g].slots, st));
    result.push_back(into_cache(in[ki + 1], outs[2 + 2 * g], segs[g].slots, st));
  }
  return result;
}

DecoderStack::DecoderStack(std::vector<std::vector<mx::array>> layer_args,
                           std::vector<BlockShape> shapes)
    : shapes_(std::move(shapes)) {
  check(!shapes_.empty() && layer_args.size() == shapes_.size(),
        "a stack needs one argument list and one shape per layer");
  std::vector<mx::array> pending;  // held by the operations, not inputs: evaluated here
  for (size_t i = 0; i < shapes_.size(); ++i) {
    check(!shapes_[i].dual, "a stack's layers are the model's, not dual");
    // a layer's block inputs: x, keys, values, anc, qpos, then its arguments
    shapes_[i].qk_norm = qk_norm_given(shapes_[i], 5 + layer_args[i].size(), 1);
    for (const auto& a : layer_args[i])
      if (!a.is_available()) pending.push_back(a);
  }
  if (!pending.empty()) mx::eval(pending);
  args_ = std::make_shared<const std::vector<std::vector<mx::array>>>(std::move(layer_args));
}

StackOut DecoderStack::forward(
    const mx::array& x0, const std::vector<mx::array>& keys, const std::vector<mx::array>& values,
    const std::vector<mx::array>& anc, const std::vector<mx::array>& qpos,
    const std::vector<int64_t>& slots, const std::vector<int64_t>& key_starts,
    const std::vector<int64_t>& windows, bool q8, const std::vector<int>& capture,
    bool in_place, const std::vector<mx::array>& after) const {
  const size_t L = shapes_.size();
  if (!(keys.size() == L && values.size() == L && anc.size() == L && qpos.size() == L &&
        slots.size() == L && key_starts.size() == L && windows.size() == L))
    check(false, "a stack forward needs keys, values, anc, qpos, slots, key_starts and windows "
                 "for each of its " + std::to_string(L) + " layers");
  check_capture(capture);
  const int64_t rows = x0.ndim() ? x0.shape(-2) : 0;
  std::vector<BlockShape> shapes = q8_shapes(q8);
  std::vector<std::vector<SegmentSpec>> segs;
  for (size_t i = 0; i < L; ++i) segs.push_back({{rows, slots[i], key_starts[i], windows[i]}});
  const bool alike = this->alike();
  auto block_inputs = [&](size_t i, const mx::array& x) {  // layer i's DecoderBlock inputs
    std::vector<mx::array> in{x, keys[i], values[i], anc[i], qpos[i]};
    in.insert(in.end(), (*args_)[i].begin(), (*args_)[i].end());
    return in;
  };
  if (!alike) {  // one DecoderBlock a layer (functional), the first after `after`
    StackOut r{after.empty() ? x0 : mx::depends({x0}, after)[0], {}, {}, {}};
    for (size_t i = 0; i < L; ++i) {
      if (r.captured.size() < capture.size() && size_t(capture[r.captured.size()]) == i)
        r.captured.push_back(r.out);
      auto out = decoder_block_op(block_inputs(i, r.out), shapes[i], segs[i]);
      r.out = out[0];
      r.keys.push_back(out[1]);
      r.values.push_back(out[2]);
    }
    if (r.captured.size() < capture.size()) r.captured.push_back(r.out);  // capture == L
    return r;
  }
  std::vector<LayerInputs> blocks;
  blocks.reserve(L);
  for (size_t i = 0; i < L; ++i)
    blocks.push_back({{&x0, &keys[i], &values[i], &anc[i], &qpos[i]}, &(*args_)[i], {}});
  // In place only where no array is given twice (as two layers', or as keys and values)
  std::unordered_set<std::uintptr_t> given;
  for (size_t i = 0; i < L; ++i) given.insert({keys[i].id(), values[i].id()});
  in_place = in_place && given.size() == 2 * L;
  mx::Stream st = mx::to_stream(mx::Device::cpu);
  std::vector<mx::array> captured;
  const auto outs = blocks_op(blocks, shapes, segs, capture, in_place, after, captured, st);
  StackOut r{outs[0], {}, {}, std::move(captured)};
  if (!in_place) {  // layer i's new keys (2i) and values (2i + 1) into its caches by slice updates
    r.keys.reserve(L);
    r.values.reserve(L);
    const int n = static_cast<int>(rows), kvh = shapes_[0].kv_heads, D = shapes_[0].head_dim;
    for (size_t i = 0; i < L; ++i) {
      const int j = 2 * static_cast<int>(i);
      r.keys.push_back(into_cache(
          keys[i], mx::slice(outs[1], {j, 0, 0, 0}, {j + 1, kvh, n, D}, st), slots[i], st));
      r.values.push_back(into_cache(
          values[i], mx::slice(outs[1], {j + 1, 0, 0, 0}, {j + 2, kvh, n, D}, st), slots[i],
          st));
    }
  }
  return r;
}

void DecoderStack::check_capture(const std::vector<int>& capture) const {
  for (size_t c = 0; c < capture.size(); ++c)
    check(capture[c] >= 0 && size_t(capture[c]) <= shapes_.size() &&
              (c == 0 || capture[c] > capture[c - 1]),
          "capture takes increasing layer ids from 0 to the layer count");
}

std::vector<mx::array> DecoderStack::blocks_op(
    const std::vector<LayerInputs>& blocks, const std::vector<BlockShape>& shapes,
    const std::vector<std::vector<SegmentSpec>>& segs, const std::vector<int>& capture,
    bool in_place, const std::vector<mx::array>& after, std::vector<mx::array>& captured,
    mx::Stream& st) const {
  const size_t L = shapes_.size();
  const mx::array& x0 = blocks[0][0];
  // Every layer's inputs checked as its own block would check them; then one operation, whose
  // inputs are what changes (DecoderBlocks): a layer's keys, values, anc and qpos, and the
  // other sequences' keys and values after its arguments
  std::vector<mx::array> inputs{x0};
  inputs.reserve(1 + L * (4 + 2 * (segs[0].size() - 1)) + after.size());
  for (size_t i = 0; i < L; ++i) {
    st = check_block(blocks[i], shapes[i], segs[i]);
    for (int h = 1; h < 5; ++h) inputs.push_back(*blocks[i].head[h]);
    for (const mx::array* a : blocks[i].more) inputs.push_back(*a);
  }
  inputs.insert(inputs.end(), after.begin(), after.end());  // read by nothing: an order
  mx::Shape out_shape = x0.shape();
  if (!out_shape.empty()) out_shape.back() = shapes_[0].hidden;
  std::vector<mx::Shape> out_shapes{out_shape};
  if (!in_place)
    out_shapes.push_back({int(2 * L), shapes_[0].kv_heads, int(segs[0][0].rows),
                          shapes_[0].head_dim});
  std::vector<int> inner;  // capture points inside the stack: their hidden states are outputs
  for (int c : capture)
    if (c > 0 && size_t(c) < L) {
      inner.push_back(c);
      out_shapes.push_back(out_shape);
    }
  auto outs = mx::array::make_arrays(
      out_shapes, std::vector<mx::Dtype>(out_shapes.size(), mx::float32),
      std::make_shared<DecoderBlocks>(st, shapes, segs, inner, in_place, args_), inputs);
  size_t k = in_place ? 1 : 2;  // the first inner capture: after out, and the rows unless in place
  for (int c : capture) captured.push_back(c == 0 ? x0 : size_t(c) == L ? outs[0] : outs[k++]);
  return outs;
}

std::vector<BlockShape> DecoderStack::q8_shapes(bool q8) const {
  std::vector<BlockShape> shapes;  // int8 activations for a quantized layer only
  for (BlockShape s : shapes_) {
    s.q8 = q8 && s.quant[0][1] != 0;
    shapes.push_back(s);
  }
  return shapes;
}

bool DecoderStack::alike() const {
  for (const auto& s : shapes_)
    if (s.hidden != shapes_[0].hidden || s.kv_heads != shapes_[0].kv_heads ||
        s.head_dim != shapes_[0].head_dim)
      return false;
  return true;
}

std::optional<mx::array> DecoderStack::forward_many(
    const mx::array& x0, const std::vector<std::vector<mx::array>>& keys,
    const std::vector<std::vector<mx::array>>& values, const mx::array& anc,
    const mx::array& qpos, const std::vector<int64_t>& rows,
    const std::vector<std::vector<int64_t>>& slots, const std::vector<int64_t>& key_starts,
    const std::vector<int64_t>& windows, bool q8, const std::vector<int>& capture,
    const std::vector<mx::array>& after, std::vector<mx::array>* captured) const {
  const size_t L = shapes_.size(), G = rows.size();
  check(G >= 1 && keys.size() == G && values.size() == G && slots.size() == G &&
            key_starts.size() == G && windows.size() == G,
        "forward_many needs rows, keys, values, slots, key_starts and windows for each sequence");
  for (size_t g = 0; g < G; ++g)
    if (!(keys[g].size() == L && values[g].size() == L && slots[g].size() == L))
      check(false, "forward_many needs each sequence's keys, values and slots for each of the "
                   "stack's " + std::to_string(L) + " layers");
  check_capture(capture);
  std::unordered_set<std::uintptr_t> given;
  for (size_t g = 0; g < G; ++g)
    for (size_t i = 0; i < L; ++i) given.insert({keys[g][i].id(), values[g][i].id()});
  if (!alike() || given.size() != 2 * L * G) return std::nullopt;  // only in place, only alike
  const std::vector<BlockShape> shapes = q8_shapes(q8);
  std::vector<std::vector<SegmentSpec>> segs(L);
  for (size_t i = 0; i < L; ++i)
    for (size_t g = 0; g < G; ++g)
      segs[i].push_back({rows[g], slots[g][i], key_starts[g], windows[g]});
  // layer i's inputs: x, sequence 0's keys and values, anc, qpos, its arguments, then the
  // other sequences' keys and values (decoder_block_op's order)
  std::vector<LayerInputs> blocks;
  blocks.reserve(L);
  for (size_t i = 0; i < L; ++i) {
    blocks.push_back({{&x0, &keys[0][i], &values[0][i], &anc, &qpos}, &(*args_)[i], {}});
    for (size_t g = 1; g < G; ++g) {
      blocks.back().more.push_back(&keys[g][i]);
      blocks.back().more.push_back(&values[g][i]);
    }
  }
  mx::Stream st = mx::to_stream(mx::Device::cpu);
  return blocks_op(blocks, shapes, segs, capture, true, after, *captured, st)[0];
}

void DecoderBlocks::eval_cpu(const std::vector<mx::array>& given,
                             std::vector<mx::array>& outputs) {
  auto& encoder = mx::cpu::get_command_encoder(stream());
  bind_arrays(encoder, given, outputs);
  const size_t L = shapes_.size(), G = segs_[0].size();
  check(in_place_ || G == 1, "DecoderBlocks runs several sequences in place only");
  const int64_t per = int64_t(shapes_[0].kv_heads) * segs_[0][0].rows * shapes_[0].head_dim;
  const int64_t n = given[0].shape(-2) * shapes_[0].hidden;
  // In place: each layer's cache buffers take its new rows; one whose last axis is strided, or
  // that shares its memory with a buffer given before it, first gets a buffer of its own
  // (own_buffer). Else (one sequence) the rows go to outputs[1], layer i's keys at 2i, values
  // at 2i + 1. caches: layer i's keys and values of sequence g at 2 (i G + g), 2 (i G + g) + 1.
  float* kv = in_place_ ? nullptr : outputs[1].data<float>();
  // layer i's inputs from first[i]: keys, values, anc, qpos, then the other sequences' keys
  // and values
  std::vector<size_t> first(L);
  std::vector<mx::array> caches;
  caches.reserve(2 * L * G);
  for (size_t i = 0, at = 1; i < L; ++i) {
    first[i] = at;
    caches.push_back(given[at]);
    caches.push_back(given[at + 1]);
    for (size_t g = 1; g < G; ++g) {
      caches.push_back(given[at + 4 + 2 * (g - 1)]);
      caches.push_back(given[at + 4 + 2 * (g - 1) + 1]);
    }
    at += 4 + 2 * (G - 1);
  }
  std::unordered_set<const void*> memory;  // the buffers' memory seen so far
  for (size_t c = 0; in_place_ && c < caches.size(); ++c)
    if (!memory.insert(caches[c].buffer().raw_ptr()).second || caches[c].strides()[3] != 1)
      own_buffer(caches[c], encoder);
  std::vector<BlockJob> jobs;
  jobs.reserve(L);
  std::vector<float*> captures(L, nullptr);
  size_t c = 0;
  for (size_t i = 0; i < L; ++i) {
    const mx::array* layer = caches.data() + 2 * i * G;
    const std::vector<mx::array>& args = (*args_)[i];
    std::vector<mx::array> block{given[0], layer[0], layer[1], given[first[i] + 2],
                                 given[first[i] + 3]};
    block.reserve(5 + args.size() + 2 * (G - 1));
    block.insert(block.end(), args.begin(), args.end());
    for (size_t g = 1; g < G; ++g) {
      block.push_back(layer[2 * g]);
      block.push_back(layer[2 * g + 1]);
    }
    std::vector<float*> k_out(G, nullptr), v_out(G, nullptr);
    if (kv != nullptr) {
      k_out[0] = kv + (2 * i) * per;
      v_out[0] = kv + (2 * i + 1) * per;
    }
    jobs.push_back(block_job(shapes_[i], segs_[i], block, i == 0, encoder, nullptr,
                             std::move(k_out), std::move(v_out)));
    if (c < capture_.size() && size_t(capture_[c]) == i)
      captures[i] = outputs[(in_place_ ? 1 : 2) + c++].data<float>();
  }
  // the task holds the layers' arguments (the jobs point into them): MLX keeps only inputs
  encoder.dispatch([jobs = std::move(jobs), captures = std::move(captures),
                    out = outputs[0].data<float>(), n, args = args_]() mutable {
    thread_local std::vector<float> between;
    if (static_cast<int64_t>(between.size()) < 2 * n) between.resize(2 * n);
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (i > 0) jobs[i].x = between.data() + ((i - 1) % 2) * n;
      jobs[i].out = i + 1 == jobs.size() ? out : between.data() + (i % 2) * n;
      if (captures[i] != nullptr) std::memcpy(captures[i], jobs[i].x, n * sizeof(float));
      run_block(jobs[i]);
    }
  });
}

void DecoderBlocks::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("EdgespecDecoderBlocks has no GPU form; the FusedBlock path runs there");
}

bool DecoderBlocks::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const DecoderBlocks&>(other);
  return shapes_ == o.shapes_ && segs_ == o.segs_ && capture_ == o.capture_ &&
         in_place_ == o.in_place_ && args_ == o.args_;
}

std::vector<mx::Shape> DecoderBlocks::output_shapes(const std::vector<mx::array>& in) {
  mx::Shape out = in[0].shape();
  out.back() = shapes_[0].hidden;
  std::vector<mx::Shape> shapes{out};
  if (!in_place_)
    shapes.push_back({int(2 * shapes_.size()), shapes_[0].kv_heads, int(segs_[0][0].rows),
                      shapes_[0].head_dim});
  for (size_t c = 0; c < capture_.size(); ++c) shapes.push_back(out);
  return shapes;
}

std::vector<mx::Shape> DecoderBlock::output_shapes(const std::vector<mx::array>& in) {
  mx::Shape out = in[X].shape();
  out.back() = shape_.hidden;
  std::vector<mx::Shape> shapes{out};
  for (const auto& g : segs_)
    for (int kv = 0; kv < 2; ++kv)
      shapes.push_back({1, shape_.kv_heads, int(g.rows), shape_.head_dim});
  return shapes;
}

bool DecoderBlock::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const DecoderBlock&>(other);
  return shape_ == o.shape_ && segs_ == o.segs_;
}

// The job of one block over a block op's inputs (given; X's data is not read where x_given is
// false: the stack puts the layer before's output there), its outputs at out and at each
// sequence's k_out / v_out. Small inputs that are not readable as they are get a copy made by a
// task on the stream, held by the encoder.
BlockJob block_job(const BlockShape& shape, const std::vector<SegmentSpec>& segs,
                   const std::vector<mx::array>& given, bool x_given,
                   mx::cpu::CommandEncoder& encoder, float* out, std::vector<float*> k_out,
                   std::vector<float*> v_out) {
  const size_t weights_end = weights_end_of(shape);
  // The small inputs row-contiguous (the weights were checked), the caches with a contiguous
  // last axis: they are read through their other strides (a sliding window's compacted cache
  // is a view); no KVCache makes one whose head_dim axis is strided, but a view could.
  std::vector<mx::array> inputs = given;
  std::vector<int> small{ANC, QPOS, INV_FREQ, N1, N2, BQKV, BGU, BD, KEYS, VALUES};
  const int norms = (shape.qk_norm ? 2 : 0) + (shape.sandwich ? 2 : 0);
  for (int i = static_cast<int>(weights_end) - norms; i < static_cast<int>(weights_end); ++i)
    small.push_back(i);
  const size_t qk_end = weights_end - (shape.sandwich ? 2 : 0);
  if (x_given) small.push_back(X);
  for (size_t i = weights_end; i < inputs.size(); ++i) small.push_back(static_cast<int>(i));
  for (int i : small) {
    const bool cache = i == KEYS || i == VALUES || i >= static_cast<int>(weights_end);
    const bool readable = cache ? inputs[i].strides()[3] == 1 : inputs[i].flags().row_contiguous;
    if (inputs[i].size() && !readable) {
      inputs[i] = row_contiguous_copy(inputs[i], encoder);
      encoder.add_temporary(inputs[i]);
    }
  }
  auto ptr = [&](int i) { return inputs[i].size() ? inputs[i].data<float>() : nullptr; };
  BlockJob job{shape, int64_t(inputs[X].shape(-2)), shape.q8,
               x_given ? ptr(X) : nullptr, ptr(INV_FREQ), ptr(N1), ptr(N2), ptr(BQKV), ptr(BGU),
               ptr(BD), {}, shape.qk_norm ? ptr(qk_end - 2) : nullptr,
               shape.qk_norm ? ptr(qk_end - 1) : nullptr,
               shape.sandwich ? ptr(weights_end - 2) : nullptr,
               shape.sandwich ? ptr(weights_end - 1) : nullptr, inputs[ANC].data<uint32_t>(),
               inputs[QPOS].data<int32_t>(), {}, out, std::move(k_out), std::move(v_out)};
  int64_t row0 = 0;
  for (size_t g = 0; g < segs.size(); ++g) {
    const auto& k = inputs[g ? weights_end + 2 * (g - 1) : KEYS];
    const auto& v = inputs[g ? weights_end + 2 * (g - 1) + 1 : VALUES];
    const auto &ks = k.strides(), &vs = v.strides();
    job.segs.push_back({row0, segs[g].rows, segs[g].slots, segs[g].key_start,
                        segs[g].window, k.data<float>(), v.data<float>(), int64_t(ks[1]),
                        int64_t(ks[2]), int64_t(vs[1]), int64_t(vs[2])});
    row0 += segs[g].rows;
  }
  for (int p = 0, at = WEIGHTS; p < 4; ++p) {
    Weights& w = job.w[p];
    if (shape.quant[p][1] == 0) {
      w.w = inputs[at++].data<float>();
    } else {
      w.wq = inputs[at].data<uint32_t>();
      w.scales = inputs[at + 1].data<void>();
      w.biases = inputs[at + 2].data<void>();
      w.half = inputs[at + 1].dtype() == mx::float16;
      w.group_size = shape.quant[p][0];
      w.bits = shape.quant[p][1];
      w.symmetric = shape.quant[p][2] != 0;
      at += 3;
    }
  }
  return job;
}

void DecoderBlock::eval_cpu(const std::vector<mx::array>& given,
                            std::vector<mx::array>& outputs) {
  auto& encoder = mx::cpu::get_command_encoder(stream());
  bind_arrays(encoder, given, outputs);
  std::vector<float*> k_out, v_out;
  for (size_t g = 0; g < segs_.size(); ++g) {
    k_out.push_back(outputs[1 + 2 * g].data<float>());
    v_out.push_back(outputs[2 + 2 * g].data<float>());
  }
  BlockJob job = block_job(shape_, segs_, given, true, encoder, outputs[0].data<float>(),
                           std::move(k_out), std::move(v_out));
  encoder.dispatch([job = std::move(job)]() { run_block(job); });
}

void DecoderBlock::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("EdgespecDecoderBlock has no GPU form; the FusedBlock path runs there");
}

int64_t decoder_blocks_copies() { return buffer_copies.load(); }

}  // namespace edgespec_native
