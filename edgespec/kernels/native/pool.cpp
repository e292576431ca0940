// See pool.h.
#include "pool.h"

#include <chrono>
#include <cstdlib>

#include <unistd.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define EDGESPEC_PAUSE() _mm_pause()
#else
#define EDGESPEC_PAUSE() std::this_thread::yield()
#endif

namespace edgespec_native {
namespace {

// How long a helper keeps polling for the next job before it sleeps (Pool::set_spin_us). A
// forward's jobs come within tens of microseconds of each other; longer polling only took a
// core from the thread that builds and reads the next step (docs/measurements.md, "The kernels'
// helpers poll for 40 us").
std::atomic<int> poll_us{40};

int configured_threads() {
  if (const char* env = std::getenv("EDGESPEC_KERNEL_THREADS")) {
    const int n = std::atoi(env);
    if (n >= 1 && n <= 64) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw < 8 ? hw : 8);
}

inline uint32_t gen_of(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
inline int64_t end_of(uint64_t w) { return static_cast<int64_t>((w >> 16) & 0xffff); }
inline int64_t next_of(uint64_t w) { return static_cast<int64_t>(w & 0xffff); }
inline uint64_t lane_word(uint32_t gen, int64_t next, int64_t end) {
  return (uint64_t(gen) << 32) | (uint64_t(end) << 16) | uint64_t(next);
}

}  // namespace

int Pool::spin_us() { return poll_us.load(); }

void Pool::set_spin_us(int us) { poll_us.store(us); }

Pool& Pool::get() {
  // Never destroyed: joining threads from a static destructor at interpreter exit can hang,
  // and the helpers hold nothing that needs releasing.
  static Pool* pool = new Pool(configured_threads());
  return *pool;
}

Pool::Pool(int threads) : threads_(threads), pid_(getpid()) {
  for (int i = 1; i < threads; ++i) std::thread([this, i] { helper_loop(i); }).detach();
}

int64_t Pool::claim(int l, uint32_t gen, bool front) {
  std::atomic<uint64_t>& word = lanes_[l].word;
  uint64_t w = word.load(std::memory_order_acquire);
  while (gen_of(w) == gen && next_of(w) < end_of(w)) {
    const uint64_t taken = front ? w + 1 : w - (uint64_t(1) << 16);
    if (word.compare_exchange_weak(w, taken, std::memory_order_acq_rel))
      return front ? next_of(w) : end_of(w) - 1;
  }
  return -1;
}

int64_t Pool::work(uint32_t gen, int lane) {
  int64_t ran = 0;
  // A claimed chunk belongs to this generation: the caller cannot publish another job (and
  // overwrite job_/ctx_) before it is counted in done_.
  auto run_one = [&](int64_t c) {
    job_(ctx_, c);
    done_.fetch_add(1, std::memory_order_acq_rel);
    ++ran;
  };
  for (int64_t c; (c = claim(lane, gen, true)) >= 0;) run_one(c);
  for (int i = 1; i < threads_; ++i) {
    const int l = (lane + i) % threads_;
    for (int64_t c; (c = claim(l, gen, false)) >= 0;) run_one(c);
  }
  return ran;
}

void Pool::run(Job job, void* ctx, int64_t chunks) {
  if (chunks <= 0) return;
  // Alone: one thread, one chunk, too many chunks for the claim word, a forked child (it
  // has no helpers), or another caller holding the helpers.
  if (threads_ == 1 || chunks == 1 || chunks > kMaxChunks || getpid() != pid_ ||
      busy_.exchange(true, std::memory_order_acquire)) {
    for (int64_t c = 0; c < chunks; ++c) job(ctx, c);
    return;
  }
  const uint32_t gen = ++generation_;
  job_ = job;
  ctx_ = ctx;
  done_.store(0, std::memory_order_relaxed);
  for (int l = threads_ - 1; l >= 0; --l)  // lane 0 last, seq_cst: see helper_loop
    lanes_[l].word.store(lane_word(gen, chunks * l / threads_, chunks * (l + 1) / threads_));
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_all();
  }
  work(gen, 0);
  int spins = 0;
  while (done_.load(std::memory_order_acquire) != chunks) {  // chunks helpers still run
    if (++spins < 4096) {
      EDGESPEC_PAUSE();
    } else {
      std::this_thread::yield();  // a helper was descheduled mid-chunk (a busy machine)
    }
  }
  busy_.store(false, std::memory_order_release);
}

void Pool::helper_loop(int lane) {
  const std::atomic<uint64_t>& published = lanes_[0].word;
  uint32_t seen = 0;
  while (true) {
    auto start = std::chrono::steady_clock::now();
    int spins = 0;
    while (gen_of(published.load(std::memory_order_acquire)) == seen) {
      EDGESPEC_PAUSE();
      if ((++spins & 63) == 0 && std::chrono::steady_clock::now() - start >
                                         std::chrono::microseconds(poll_us.load(std::memory_order_relaxed))) {
        // Sleep. The caller stores lane 0's word and then reads sleepers_ (both seq_cst),
        // this thread counts itself in sleepers_ and then reads the word: one of them sees
        // the other.
        std::unique_lock<std::mutex> lock(mutex_);
        sleepers_.fetch_add(1);
        while (gen_of(published.load()) == seen) wake_.wait(lock);
        sleepers_.fetch_sub(1);
        break;
      }
    }
    seen = gen_of(published.load(std::memory_order_acquire));
    work(seen, lane);
  }
}

}  // namespace edgespec_native
