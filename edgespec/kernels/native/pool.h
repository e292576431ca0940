// A tiny persistent thread pool for the kernels, made for a machine that may be busy.
//
// A job is `chunks` independent pieces, dealt out as one contiguous lane per thread: the
// calling thread (MLX's CPU stream worker) takes lane 0, helper i lane i. Each thread claims the
// chunks of its own lane one at a time, in order, from that lane's atomic word, and then takes
// the last unclaimed chunks of the other lanes, one at a time from their far ends. So a helper
// that the OS has not scheduled simply takes none (the caller never waits for a thread to wake
// up, only for chunks already claimed), and each thread otherwise walks through memory in
// order: the kernels' prefetch of the rows after a chunk reads the next chunk it will run
// (claiming chunks from one shared word instead, the threads alternated, and every chunk began
// on cold weights; docs/measurements.md, "the kernels' remaining slack"). Helpers poll
// for up to 40 us after a job (the next product of a forward comes within tens of
// microseconds; set_spin_us), then sleep on a condition variable, so an idle process costs no
// CPU.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace edgespec_native {

class Pool {
 public:
  using Job = void (*)(void* ctx, int64_t chunk);

  // The most chunks one job may have (a lane's claim word holds chunk indices in 16 bits).
  static constexpr int64_t kMaxChunks = 65535;
  // The most threads (lanes) a pool has.
  static constexpr int kMaxThreads = 64;

  // The process-wide pool; its size is EDGESPEC_KERNEL_THREADS if set (1..64), else the
  // number of hardware threads capped at 8.
  static Pool& get();

  int threads() const { return threads_; }

  // How long (microseconds) a helper polls for the next job after one before it sleeps: 40 by
  // default; 0 sleeps after a short spin (64 pauses). Process-wide; for tests and A/B timings
  // (the same results).
  static int spin_us();
  static void set_spin_us(int us);

  // Runs job(ctx, c) for every c in [0, chunks) and returns when all have finished. One
  // caller at a time uses the helpers (MLX runs a stream's tasks on one thread); a second
  // caller meanwhile (another stream's thread) runs its chunks alone on its own thread.
  void run(Job job, void* ctx, int64_t chunks);

 private:
  explicit Pool(int threads);
  void helper_loop(int lane);
  // Claims and runs chunks of the job published as generation `gen`, its own lane's first,
  // until none is left; returns how many it ran.
  int64_t work(uint32_t gen, int lane);
  // Claims one chunk of lane `l` of generation `gen`: the next one (front) or the last one;
  // -1 when the lane has none left (or holds another generation).
  int64_t claim(int l, uint32_t gen, bool front);

  const int threads_;
  const int pid_;  // the process that started the helpers
  // Per lane: generation (32 bits) | end (16: one past its last unclaimed chunk) | next
  // unclaimed chunk (16); each on its own cache line. Lane 0's word is published last: a
  // helper that sees its generation sees every lane's.
  struct alignas(64) Lane {
    std::atomic<uint64_t> word{0};
  };
  Lane lanes_[kMaxThreads];
  std::atomic<int64_t> done_{0};
  uint32_t generation_ = 0;  // the caller's count of published jobs
  Job job_ = nullptr;
  void* ctx_ = nullptr;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> busy_{false};  // a caller is using the helpers
  std::mutex mutex_;
  std::condition_variable wake_;
};

}  // namespace edgespec_native
