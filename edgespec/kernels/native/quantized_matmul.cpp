// See quantized_matmul.h and kernel_q.h.
#include "quantized_matmul.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "aligned_room.h"
#include "dispatch.h"
#include "kernel.h"
#include "kernel_q.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "pool.h"

namespace edgespec_native {

namespace {

// 2: the AVX-512 VNNI form runs; 1: the AVX2 one; 0: none (see q8_form).
int q8_form_for(const std::string& name) {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (name == "avx512" && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vnni"))
    return 2;
  // the AVX2 form widens float16 scales with F16C, which every AVX2 CPU has
  return (name == "avx512" || name == "avx2") && __builtin_cpu_supports("f16c") ? 1 : 0;
#else
  (void)name;
  return 0;
#endif
}

int q8_form() { return q8_form_for(isa()); }

}  // namespace

bool has_q8_activations() { return q8_form() != 0; }

bool q8_vnni() { return q8_form() == 2; }

void qrows_generic(int bits, const float* x, int64_t ldx, const uint8_t* wq, int64_t ldq,
                   const float* s, const float* b, int64_t ldg, float* y, int64_t ldy, int64_t M,
                   int64_t K, int64_t gs, int64_t n0, int64_t n1) {
  const uint32_t mask = (1u << bits) - 1u;
  for (int64_t n = n0; n < n1; ++n) {
    const uint32_t* row = reinterpret_cast<const uint32_t*>(wq + n * ldq);
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t bit = k * bits;
        const float q = static_cast<float>((row[bit / 32] >> (bit % 32)) & mask);
        acc += x[m * ldx + k] * (s[n * ldg + k / gs] * q + b[n * ldg + k / gs]);
      }
      y[m * ldy + n] = acc;
    }
  }
}

namespace {

// -1: not decided yet; then 0 or 1 (see buffered_dequantization).
std::atomic<int> g_buffered{-1};

}  // namespace

bool buffered_dequantization() {
  int on = g_buffered.load(std::memory_order_relaxed);
  if (on < 0) {
    const char* env = std::getenv("EDGESPEC_QBUFFER");
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
    const bool intel = __builtin_cpu_is("intel");
#else
    const bool intel = false;
#endif
    on = env != nullptr && (env[0] == '0' || env[0] == '1') ? env[0] - '0' : intel;
    g_buffered.store(on, std::memory_order_relaxed);
  }
  return on == 1;
}

void set_buffered_dequantization(bool on) { g_buffered.store(on ? 1 : 0, std::memory_order_relaxed); }

int64_t dequantized_gemm_rows() { return buffered_dequantization() ? 33 : 9; }

namespace {

struct QJob {
  int isa;  // 2: AVX-512, 1: AVX2, 0: generic
  int bits;
  bool q8;  // x quantized to int8 (kernel_q.h's round layout): xr, xd, xs below
  const int8_t* xr;
  const float *xd, *xs;
  int64_t ldr, ldf;
  const float* x;
  int64_t ldx;
  const uint8_t* wq;
  int64_t ldq;
  const void *s, *b;  // float32, or float16 where half
  bool half;
  int64_t ldg;
  float* y;
  int64_t ldy, M, N, K, gs, rows;
  // Set by run_qjob: more than 4 rows, dequantize each column block once (kernel_q.h's buf);
  // dequantized_gemm_rows() or more, each chunk dequantized, then the float kernel.
  bool buffered = false, gemm = false;
  int form = 0;  // q8_form(), asked once per job
  bool symmetric = false;  // every bias is -2^(bits - 1) times its scale (quantized_matmul.h)
};

void run_qrows(const QJob& j, int64_t n0, int64_t n1);

void run_qchunk(void* ctx, int64_t chunk) {
  const QJob& j = *static_cast<const QJob*>(ctx);
  const int64_t n0 = chunk * j.rows, n1 = n0 + j.rows < j.N ? n0 + j.rows : j.N;
#if defined(__x86_64__) || defined(_M_X64)
  if (j.q8)
    return (j.form == 2 ? q8rows_avx512vnni : q8rows_avx2)(
        j.bits, j.xr, j.ldr, j.xd, j.xs, j.ldf, j.wq, j.ldq, j.s, j.b, j.half, j.ldg, j.y, j.ldy,
        j.M, j.K, j.gs, n0, n1);
#endif
  if (!j.half) return run_qrows(j, n0, n1);
  // The float-activation forms read float32 scales: this chunk's, widened (the same values),
  // its rows then numbered from 0.
  thread_local std::vector<float> widened;
  const int64_t n = (n1 - n0) * j.ldg;
  if (static_cast<int64_t>(widened.size()) < 2 * n) widened.resize(2 * n);
  const mx::float16_t *s = static_cast<const mx::float16_t*>(j.s) + n0 * j.ldg,
                      *b = static_cast<const mx::float16_t*>(j.b) + n0 * j.ldg;
  for (int64_t i = 0; i < n; ++i) {
    widened[i] = static_cast<float>(s[i]);
    widened[n + i] = static_cast<float>(b[i]);
  }
  QJob c = j;
  c.s = widened.data();
  c.b = widened.data() + n;
  c.half = false;
  c.wq = j.wq + n0 * j.ldq;
  c.y = j.y + n0;
  run_qrows(c, 0, n1 - n0);
}

// Columns n0..n1-1 of the float-activation forms (float32 scales and biases).
void run_qrows(const QJob& j, int64_t n0, int64_t n1) {
  const float *js = static_cast<const float*>(j.s), *jb = static_cast<const float*>(j.b);
#if defined(__x86_64__) || defined(_M_X64)
  if (j.gemm) {
    // The chunk's float weights (~128 KB) stay in L2 while the float kernel runs every block
    // of kSlab rows of x against them.
    constexpr int64_t kSlab = 64;
    thread_local std::vector<float> weights;
    float* wf = aligned_room(weights, (n1 - n0) * j.K);
    (j.isa == 2 ? qdequantize_avx512 : qdequantize_avx2)(j.bits, j.wq, j.ldq, js, jb, j.ldg,
                                                         j.K, j.gs, n0, n1, wf, j.K);
    const RowsFn rows = j.isa == 2 ? rows_avx512 : rows_avx2;
    for (int64_t m = 0; m < j.M; m += kSlab)
      rows(j.x + m * j.ldx, j.ldx, wf, j.K, j.y + m * j.ldy + n0, j.ldy,
           j.M - m < kSlab ? j.M - m : kSlab, j.K, 0, n1 - n0);
    return;
  }
  float* buf = nullptr;
  if (j.buffered) {  // this thread's scratch, grown as needed
    thread_local std::vector<float> room;
    buf = aligned_room(room, 4 * j.K);
  }
  if (j.isa == 2)
    return qrows_avx512(j.bits, j.x, j.ldx, j.wq, j.ldq, js, jb, j.ldg, j.y, j.ldy, j.M, j.K,
                        j.gs, n0, n1, buf);
  if (j.isa == 1)
    return qrows_avx2(j.bits, j.x, j.ldx, j.wq, j.ldq, js, jb, j.ldg, j.y, j.ldy, j.M, j.K,
                      j.gs, n0, n1, buf);
#endif
  qrows_generic(j.bits, j.x, j.ldx, j.wq, j.ldq, js, jb, j.ldg, j.y, j.ldy, j.M, j.K, j.gs, n0,
                n1);
}

// x (M, K; row stride ldx) with each 32-value block de-interleaved into xp (M, K): the
// order the AVX-512 and AVX2 forms take for 4 bits (kernel_q.h).
void deinterleave32(const float* x, int64_t ldx, float* xp, int64_t M, int64_t K) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; k += 32)
      for (int t = 0; t < 16; ++t) {
        xp[m * K + k + t] = x[m * ldx + k + 2 * t];
        xp[m * K + k + 16 + t] = x[m * ldx + k + 2 * t + 1];
      }
}

// x (M, K; row stride ldx) quantized per 32-value block in kernel_q.h's round layout:
// d = max|x| / 127, q = round-half-even(x / d) (0 where d is 0), as qmatmul.py's twin does it;
// in this thread's buffers (valid until its next call).
struct X8 {
  const int8_t* xr;
  const float *xd, *xs;
  int64_t ldr, ldf;
};

// kernel_q.h's rounding in portable C++ (q8quantize_avx512 gives the same bits) into xr, xd,
// xs, zeroed past K by the caller.
void quantize_x8_portable(const float* x, int64_t ldx, int64_t M, int64_t K, int bits,
                          int8_t* xr, int64_t ldr, float* xd, float* xs, int64_t ldf) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
      const float* xb = x + m * ldx + k0;
      float amax = 0.0f;
      bool finite = true;
      for (int t = 0; t < 32; ++t) {
        finite = finite && std::isfinite(xb[t]);
        amax = std::fmax(amax, std::fabs(xb[t]));
      }
      // A NaN or infinity makes the block's scale NaN, so it reaches the outputs as NaN.
      const float d = finite ? amax / 127.0f : std::nanf("");
      const int64_t st = k0 / 128, blk = (k0 % 128) / 32;
      int8_t* step = xr + m * ldr + st * 128;
      int sum = 0;
      for (int t = 0; t < 32; ++t) {
        // round half to even: adding and taking away 1.5 * 2^23 leaves |v| <= 127 rounded as
        // nearbyint does in the default rounding mode, and vectorizes
        const float v = finite && d > 0.0f ? xb[t] / d : 0.0f;
        const int q = static_cast<int>((v + 12582912.0f) - 12582912.0f);
        sum += q;
        // value t's round and byte: 8 bits in order; 4 bits the even values, then the odd
        const int e = bits == 8 ? t / 4 : (t % 2) * 4 + (t / 2) / 4;
        const int byte = bits == 8 ? t % 4 : (t / 2) % 4;
        step[e * 16 + 4 * blk + byte] = static_cast<int8_t>(q);
      }
      xd[m * ldf + st * 4 + blk] = d;
      xs[m * ldf + st * 4 + blk] = d * static_cast<float>(sum);
    }
}

// form: q8_form() (2: the AVX-512 rounding into the VNNI form's lane layout, a row's step
// 128 bytes and 32 floats with its d * sum(q) beside d; else the portable one into rows, a
// step 128 bytes and 4 floats in each of xd and xs).
X8 quantize_x8(const float* x, int64_t ldx, int64_t M, int64_t K, int bits, int form) {
  thread_local std::vector<int8_t> rounds;
  thread_local std::vector<float> floats;
  const int64_t steps = (K + 127) / 128;
  const bool lanes = form == 2;
  const int64_t step_bytes = 128, step_floats = lanes ? 32 : 4;
  const int64_t ldr = steps * step_bytes, ldf = steps * step_floats;
  if (static_cast<int64_t>(rounds.size()) < M * ldr) rounds.resize(M * ldr);
  const int64_t halves = lanes ? 1 : 2;  // the lane layout keeps d * sum(q) in xd's steps
  if (static_cast<int64_t>(floats.size()) < halves * M * ldf) floats.resize(halves * M * ldf);
  int8_t* xr = rounds.data();
  float *xd = floats.data(), *xs = lanes ? nullptr : xd + M * ldf;
  if (K % 128 != 0) {  // the last step's room past K
    for (int64_t m = 0; m < M; ++m) {
      std::memset(xr + m * ldr + ldr - step_bytes, 0, step_bytes);
      std::memset(xd + m * ldf + ldf - step_floats, 0, step_floats * sizeof(float));
      if (xs != nullptr)
        std::memset(xs + m * ldf + ldf - step_floats, 0, step_floats * sizeof(float));
    }
  }
#if defined(__x86_64__) || defined(_M_X64)
  if (form == 2) {
    q8quantize_avx512(bits, x, ldx, M, K, xr, ldr, xd, xs, ldf);
    return {xr, xd, xs, ldr, ldf};
  }
#endif
  quantize_x8_portable(x, ldx, M, K, bits, xr, ldr, xd, xs, ldf);
  return {xr, xd, xs, ldr, ldf};
}

// A weight as it is where it is already evaluated and row-contiguous, else mx::contiguous of
// it. mx::contiguous copies a row-contiguous view too when its buffer is much larger than the
// view, which every weight placed in targets/weight_arena's shared buffers is (a prefill
// would copy every packed weight it reads).
mx::array as_rows(const mx::array& a, mx::Stream s) {
  return a.is_available() && a.flags().row_contiguous ? a : mx::contiguous(a, false, s);
}

// The message is a literal, so that a check that holds allocates nothing.
void check(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("quantized_small_matmul: ") + what);
}

void run_qjob(QJob job) {
  if (job.M == 0 || job.N == 0) return;
  job.form = q8_form();
  job.q8 = job.q8 && job.form != 0;  // the op and the block ask has_q8_activations() first
  if (job.symmetric && job.q8 && job.form == 2) job.b = nullptr;  // made from the scales
  job.gemm = !job.q8 && job.isa != 0 && job.M >= dequantized_gemm_rows();
  job.buffered = !job.q8 && !job.gemm && job.isa != 0 && job.M > 4 && buffered_dequantization();
  std::vector<float> xp;
  X8 x8{};
  if (job.q8) {
    x8 = quantize_x8(job.x, job.ldx, job.M, job.K, job.bits, job.form);
    job.xr = x8.xr;
    job.xd = x8.xd;
    job.xs = x8.xs;
    job.ldr = x8.ldr;
    job.ldf = x8.ldf;
  } else if (job.bits == 4 && job.isa != 0) {
    float* at = aligned_room(xp, job.M * job.K);  // rows on cache lines: no load splits one
    deinterleave32(job.x, job.ldx, at, job.M, job.K);
    job.x = at;
    job.ldx = job.K;
  } else if (job.buffered && reinterpret_cast<uintptr_t>(job.x) % 64 != 0) {
    float* at = aligned_room(xp, job.M * job.K);  // the same for 8 bits (a head's x is MLX's)
    for (int64_t m = 0; m < job.M; ++m)
      std::memcpy(at + m * job.K, job.x + m * job.ldx, job.K * sizeof(float));
    job.x = at;
    job.ldx = job.K;
  }
  // Chunks of about 32 K weights, on multiples of 4 rows (the AVX-512 column block), or of 16
  // where the VNNI form's wide form runs (kernel_q.h's kQ8WideRows).
#if defined(__x86_64__) || defined(_M_X64)
  const int64_t block = job.q8 && job.form == 2 && job.M >= kQ8WideRows ? 16 : 4;
#else
  const int64_t block = 4;
#endif
  job.rows = ((32 * 1024) / job.K + block - 1) / block * block;
  if (job.rows < block) job.rows = block;
  int64_t chunks = (job.N + job.rows - 1) / job.rows;
  if (chunks > Pool::kMaxChunks) {
    chunks = Pool::kMaxChunks;
    job.rows = (job.N + chunks - 1) / chunks;
  }
  Pool::get().run(run_qchunk, &job, chunks);
}

}  // namespace

void quantized_small_matmul(const float* x, int64_t ldx, const uint32_t* wq, const void* scales,
                            const void* biases, bool half, float* y, int64_t ldy, int64_t M,
                            int64_t N, int64_t K, int group_size, int bits, bool q8,
                            bool symmetric) {
  QJob job{isa() == "avx512" ? 2 : isa() == "avx2" ? 1 : 0, bits, q8, nullptr, nullptr, nullptr,
           0, 0, x, ldx, reinterpret_cast<const uint8_t*>(wq),
           K * bits / 8, scales, biases, half, K / group_size, y, ldy, M, N, K, group_size, 0};
  job.symmetric = symmetric;
  run_qjob(job);
}

mx::array quantized_small_matmul_op(const mx::array& x, const mx::array& wq,
                                    const mx::array& scales, const mx::array& biases,
                                    int group_size, int bits, bool q8, bool symmetric) {
  check(bits == 4 || bits == 8, "bits must be 4 or 8");
  check(!q8 || has_q8_activations(),
        "int8 activations need AVX2 or AVX-512 code (has_q8_activations())");
  check(group_size == 32 || group_size == 64 || group_size == 128,
        "group_size must be 32, 64 or 128");
  check(x.dtype() == mx::float32 && wq.dtype() == mx::uint32 &&
            (scales.dtype() == mx::float32 || scales.dtype() == mx::float16) &&
            biases.dtype() == scales.dtype(),
        "need float32 x, uint32 wq, and scales and biases both float32 or both float16");
  check(x.ndim() >= 1 && wq.ndim() == 2 && scales.ndim() == 2 && scales.shape() == biases.shape(),
        "need x (..., K), wq (N, K*bits/32), scales and biases (N, K/group_size)");
  const int K = x.shape(-1), N = wq.shape(0);
  check(K % group_size == 0 && wq.shape(1) * 32 == K * bits && scales.shape(0) == N &&
            scales.shape(1) * group_size == K,
        "shapes do not match K = x.shape[-1] with this group_size and bits");
  auto s = mx::to_stream(mx::StreamOrDevice{});
  if (s.device.type != mx::Device::cpu) s = mx::to_stream(mx::Device::cpu);
  int64_t M = 1;
  for (int i = 0; i + 1 < static_cast<int>(x.ndim()); ++i) M *= x.shape(i);
  mx::Shape out_shape = x.shape();
  out_shape.back() = N;
  auto x2 = mx::contiguous(mx::reshape(x, {static_cast<int>(M), K}, s), false, s);
  auto y = mx::array(
      {static_cast<int>(M), N}, mx::float32,
      std::make_shared<QuantizedSmallMatmul>(s, group_size, bits, q8, symmetric),
      {x2, as_rows(wq, s), as_rows(scales, s), as_rows(biases, s)});
  return mx::reshape(y, out_shape, s);
}

std::vector<mx::Shape> QuantizedSmallMatmul::output_shapes(const std::vector<mx::array>& in) {
  return {{in[0].shape(0), in[1].shape(0)}};
}

void QuantizedSmallMatmul::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto &x = inputs[0], &wq = inputs[1], &sc = inputs[2], &bi = inputs[3];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);
  QJob job{isa() == "avx512" ? 2 : isa() == "avx2" ? 1 : 0, bits_, q8_, nullptr, nullptr, nullptr,
           0, 0, x.data<float>(), int64_t(x.shape(1)),
           reinterpret_cast<const uint8_t*>(wq.data<uint32_t>()), int64_t(wq.shape(1)) * 4,
           sc.data<void>(), bi.data<void>(), sc.dtype() == mx::float16, int64_t(sc.shape(1)),
           out.data<float>(), int64_t(out.shape(1)), int64_t(x.shape(0)),
           int64_t(wq.shape(0)), int64_t(x.shape(1)), group_size_, 0};
  job.symmetric = symmetric_;
  encoder.dispatch([job]() { run_qjob(job); });
}

void QuantizedSmallMatmul::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("EdgespecQuantizedSmallMatmul has no GPU form");
}

namespace {

void check_rows(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("quantized_rows: ") + what);
}

}  // namespace

mx::array quantized_rows_op(const mx::array& ids, const mx::array& wq, const mx::array& scales,
                            const mx::array& biases, int group_size, int bits) {
  check_rows(bits == 4 || bits == 8, "bits must be 4 or 8");
  check_rows(group_size == 32 || group_size == 64 || group_size == 128,
             "group_size must be 32, 64 or 128");
  check_rows((ids.dtype() == mx::int32 || ids.dtype() == mx::uint32) &&
                 wq.dtype() == mx::uint32 && scales.dtype() == mx::float32 &&
                 biases.dtype() == mx::float32,
             "need int32 or uint32 ids (argmax gives uint32), uint32 wq, and float32 scales and "
             "biases");
  check_rows(wq.ndim() == 2 && scales.ndim() == 2 && scales.shape() == biases.shape() &&
                 scales.shape(0) == wq.shape(0) &&
                 int64_t(scales.shape(1)) * group_size * bits == int64_t(wq.shape(1)) * 32,
             "need wq (V, K bits / 32), scales and biases (V, K / group_size)");
  auto s = mx::to_stream(mx::StreamOrDevice{});
  if (s.device.type != mx::Device::cpu) s = mx::to_stream(mx::Device::cpu);
  mx::Shape out_shape = ids.shape();
  out_shape.push_back(scales.shape(1) * group_size);
  return mx::array(out_shape, mx::float32, std::make_shared<QuantizedRows>(s, group_size, bits),
                   {mx::contiguous(ids, false, s), as_rows(wq, s), as_rows(scales, s),
                    as_rows(biases, s)});
}

std::vector<mx::Shape> QuantizedRows::output_shapes(const std::vector<mx::array>& in) {
  mx::Shape out = in[0].shape();
  out.push_back(in[2].shape(1) * group_size_);
  return {out};
}

void QuantizedRows::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto &ids = inputs[0], &wq = inputs[1], &sc = inputs[2], &bi = inputs[3];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);
  const bool is_signed = ids.dtype() == mx::int32;
  const int32_t* sid = is_signed ? ids.data<int32_t>() : nullptr;
  const uint32_t* uid = is_signed ? nullptr : ids.data<uint32_t>();
  const uint32_t* w = wq.data<uint32_t>();
  const float *s = sc.data<float>(), *b = bi.data<float>();
  float* y = out.data<float>();
  const int64_t n = int64_t(ids.size()), V = wq.shape(0), words = wq.shape(1),
                groups = sc.shape(1), gs = group_size_, bits = bits_;
  encoder.dispatch([=]() {
    const int64_t K = groups * gs, per = 32 / bits;
    const uint32_t mask = (1u << bits) - 1u;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t v = is_signed ? int64_t(sid[r]) : int64_t(uid[r]);
      float* yr = y + r * K;
      if (v < 0 || v >= V) {  // not a row of the table
        for (int64_t k = 0; k < K; ++k) yr[k] = std::nanf("");
        continue;
      }
      const uint32_t* row = w + v * words;
      for (int64_t k = 0; k < K; ++k) {
        const float q = static_cast<float>((row[k / per] >> (bits * (k % per))) & mask);
        // rounded on its own, as mx.dequantize's product is: no fused multiply-add
        const volatile float p = q * s[v * groups + k / gs];
        yr[k] = p + b[v * groups + k / gs];
      }
    }
  });
}

void QuantizedRows::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("EdgespecQuantizedRows has no GPU form");
}

}  // namespace edgespec_native
