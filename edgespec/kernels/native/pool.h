// A tiny persistent thread pool for the kernels, made for a machine that may be busy.
//
// A job is `chunks` independent pieces. The calling thread (MLX's CPU stream worker) and the
// helper threads claim chunks one at a time from one atomic word until none are left, so a
// helper that the OS has not scheduled simply takes none: the caller never waits for a thread
// to wake up, only for chunks already claimed. Helpers poll briefly after a job (the next
// product of a forward comes within microseconds), then sleep on a condition variable, so an
// idle process costs no CPU.
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

  // The most chunks one job may have (the claim word holds the count in 16 bits).
  static constexpr int64_t kMaxChunks = 65535;

  // The process-wide pool; its size is EDGESPEC_KERNEL_THREADS if set (1..64), else the
  // number of hardware threads capped at 8.
  static Pool& get();

  int threads() const { return threads_; }

  // Runs job(ctx, c) for every c in [0, chunks) and returns when all have finished. One
  // caller at a time uses the helpers (MLX runs a stream's tasks on one thread); a second
  // caller meanwhile (another stream's thread) runs its chunks alone on its own thread.
  void run(Job job, void* ctx, int64_t chunks);

 private:
  explicit Pool(int threads);
  void helper_loop();
  // Claims and runs chunks of the job published as generation `gen` until none is left;
  // returns how many it ran.
  int64_t work(uint32_t gen);

  const int threads_;
  const int pid_;  // the process that started the helpers
  // generation (32 bits) | chunk count (16) | next unclaimed chunk (16)
  std::atomic<uint64_t> claim_{0};
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
