// See dispatch.h. The generic row function (plain C++, whatever the compiler makes of it) is
// the fallback on CPUs without AVX2/FMA and on other architectures.
#include "dispatch.h"

#include <atomic>
#include <chrono>
#include <cstdlib>

#include "kernel.h"
#include "kernel_q.h"
#include "pool.h"
#include "quantized_matmul.h"

namespace edgespec_native {

void rows_generic(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
                  int64_t ldy, int64_t M, int64_t K, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s += x[m * ldx + k] * w[n * ldw + k];
      y[m * ldy + n] = s;
    }
}

namespace {

// Below this many weight elements a product runs on the calling thread alone: waking a
// helper costs more than the half of the work it would take.
constexpr int64_t kThreadedMinWeights = 64 * 1024;

bool cpu_has(const std::string& name) {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (name == "avx512") return __builtin_cpu_supports("avx512f");
  if (name == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return name == "generic";
}

RowsFn fn_for(const std::string& name) {
#if defined(__x86_64__) || defined(_M_X64)
  if (name == "avx512") return rows_avx512;
  if (name == "avx2") return rows_avx2;
#endif
  return rows_generic;
}

struct Choice {
  std::atomic<RowsFn> fn;
  std::string name;
};

Choice& choice() {
  static Choice* c = [] {
    auto* c = new Choice();
    std::string name = "generic";
    for (const char* cand : {"avx512", "avx2"})
      if (cpu_has(cand)) {
        name = cand;
        break;
      }
    if (const char* env = std::getenv("EDGESPEC_KERNEL_ISA"))
      if (cpu_has(env)) name = env;
    c->name = name;
    c->fn.store(fn_for(name));
    return c;
  }();
  return *c;
}

// Threads claim N in chunks of about this many weight elements (a multiple of
// kRowsPerBlock rows): small enough that a busy machine's descheduled helper holds up little.
constexpr int64_t kChunkWeights = 32 * 1024;

struct Job {
  RowsFn fn;
  const float* x;
  int64_t ldx;
  const float* w;
  int64_t ldw;
  float* y;
  int64_t ldy, M, N, K, rows;  // rows: per chunk
};

void run_chunk(void* ctx, int64_t chunk) {
  const Job& j = *static_cast<const Job*>(ctx);
  const int64_t n0 = chunk * j.rows;
  const int64_t n1 = n0 + j.rows < j.N ? n0 + j.rows : j.N;
  j.fn(j.x, j.ldx, j.w, j.ldw, j.y, j.ldy, j.M, j.K, n0, n1);
}

}  // namespace

std::string isa() { return choice().name; }

bool set_isa(const std::string& name) {
  if (!cpu_has(name)) return false;
  choice().name = name;
  choice().fn.store(fn_for(name));
  return true;
}

std::string supported_isas() {
  std::string out;
  for (const char* cand : {"avx512", "avx2", "generic"})
    if (cpu_has(cand)) out += out.empty() ? cand : std::string(",") + cand;
  return out;
}

int threads() { return Pool::get().threads(); }

namespace {

struct PeakJob {
  int lanes;  // multiply-adds per instruction (16, 8, 1: the FMA loops; 64: the vpdpbusd loop)
  int64_t iters;
  std::atomic<uint32_t> sink{0};
};

void run_peak_chunk(void* ctx, int64_t) {
  auto& j = *static_cast<PeakJob*>(ctx);
  float s = 0.0f;
#if defined(__x86_64__) || defined(_M_X64)
  if (j.lanes == 64) s = static_cast<float>(q8_dot_loop_avx512vnni(j.iters) & 1);
  if (j.lanes == 16) s = fma_loop_avx512(j.iters);
  if (j.lanes == 8) s = fma_loop_avx2(j.iters);
#endif
  if (j.lanes == 1) {  // plain C++: 12 chains, whatever the compiler makes of them
    float acc[12];
    for (int c = 0; c < 12; ++c) acc[c] = 1.0f + 0.01f * c;
    for (int64_t i = 0; i < j.iters; ++i)
      for (int c = 0; c < 12; ++c) acc[c] = acc[c] * 0.999f + 1e-3f;
    for (int c = 0; c < 12; ++c) s += acc[c];
  }
  j.sink.fetch_add(static_cast<uint32_t>(s), std::memory_order_relaxed);  // keeps the loop
}

// The best of `rounds` timings of `chunks` chunks of `job` (all threads, or the calling one
// alone), in multiply-adds per second.
double peak_rate(PeakJob& job, int rounds, bool all_threads) {
  const int64_t chunks = 8 * (all_threads ? threads() : 1);
  double best = 0.0;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (all_threads)
      Pool::get().run(run_peak_chunk, &job, chunks);
    else
      for (int64_t c = 0; c < chunks; ++c) run_peak_chunk(&job, c);  // the calling thread alone
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double rate = double(chunks) * job.iters * 12 * job.lanes / s;
    if (rate > best) best = rate;
  }
  return best;
}

}  // namespace

double q8_peak(int rounds, bool all_threads) {
  if (!q8_vnni()) return 0.0;
  PeakJob job;
  job.lanes = 64;
  job.iters = 200000;
  return peak_rate(job, rounds, all_threads);
}

double fma_peak(int rounds, bool all_threads) {
  const std::string name = isa();
  PeakJob job;
  job.lanes = name == "avx512" ? 16 : name == "avx2" ? 8 : 1;
  job.iters = 200000;  // 2.4 M vector FMAs a chunk
  return peak_rate(job, rounds, all_threads);
}

void small_matmul(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
                  int64_t ldy, int64_t M, int64_t N, int64_t K) {
  const RowsFn fn = choice().fn.load();
  if (N * K < kThreadedMinWeights) {
    fn(x, ldx, w, ldw, y, ldy, M, K, 0, N);
    return;
  }
  int64_t rows = (kChunkWeights / K + kRowsPerBlock - 1) / kRowsPerBlock * kRowsPerBlock;
  if (rows < kRowsPerBlock) rows = kRowsPerBlock;
  int64_t chunks = (N + rows - 1) / rows;
  if (chunks > Pool::kMaxChunks) {
    chunks = Pool::kMaxChunks;
    rows = (N + chunks - 1) / chunks;
  }
  Job job{fn, x, ldx, w, ldw, y, ldy, M, N, K, rows};
  Pool::get().run(run_chunk, &job, chunks);
}

}  // namespace edgespec_native
