// metal_emu.h: just enough of Metal's execution model to run an mx.fast.metal_kernel body with
// the system C++ compiler (g++ -std=c++20), so that the kernels' own source is executed in CI on
// machines without Metal. edgespec/kernels/metal_emulation.py wraps a body in a function and
// compiles it against this header; it is a test tool, not a fast path.
//
// The model emulated:
//  - a launch is a grid of threads (MLX dispatches ``grid`` threads in ``threadgroup``-sized
//    groups; the grid must be a multiple of the group size in every dimension here);
//  - threadgroups run one after another; the threads of one group run as cooperative fibers
//    (ucontext) on one OS thread, in a fixed order, each until it finishes or waits;
//  - ``threadgroup`` variables are shared by the threads of a group (declared in the body as
//    ``threadgroup T name[n];``: they become function statics, and are filled with a garbage
//    pattern before every group so that a read before any write shows up as wrong results);
//  - ``threadgroup_barrier``: a fiber waits until every unfinished thread of its group waits on a
//    barrier; a group in which some threads finished while others wait on a barrier is an error
//    (Metal's behaviour is undefined there), as is a deadlock;
//  - SIMD groups of 32 consecutive threads (linear index in the group): ``simd_sum``,
//    ``simd_max``, ``simd_min``, ``simd_shuffle``, ``simd_shuffle_down/up/xor``,
//    ``simd_broadcast``, ``simd_prefix_exclusive_sum`` exchange values among the group's
//    unfinished lanes (finished lanes are inactive, as on the GPU);
//  - ``half`` is _Float16, ``bfloat16_t`` a 16-bit struct (round to nearest even), ``metal::``
//    math maps to <cmath>; ``device``, ``constant``, ``thread`` qualifiers are empty.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace metal_emu {

constexpr unsigned SIMD_WIDTH = 32;

// ---- types ------------------------------------------------------------------------------------
struct bfloat16_t {
  uint16_t bits = 0;
  bfloat16_t() = default;
  bfloat16_t(float f) {  // round to nearest even (NaN kept quiet)
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = uint16_t((u >> 16) | 0x40u);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = uint16_t(u >> 16);
    }
  }
  bfloat16_t(double d) : bfloat16_t(float(d)) {}
  bfloat16_t(int i) : bfloat16_t(float(i)) {}
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

template <typename S>
struct vec2 { S x, y; };
template <typename S>
struct vec3 { S x, y, z; };

// ---- the scheduler ----------------------------------------------------------------------------
enum class Wait { none, barrier, simd, done };

constexpr size_t STACK_BYTES = 128 * 1024;

// Fiber stacks, allocated once per OS thread and reused by every launch.
inline char* stack_for(unsigned i) {
  static thread_local std::vector<char*> stacks;
  while (stacks.size() <= i) stacks.push_back(static_cast<char*>(std::malloc(STACK_BYTES)));
  return stacks[i];
}

struct Fiber {
  ucontext_t ctx;
  Wait wait = Wait::none;
  unsigned barriers = 0;  // threadgroup barriers passed in this group
  uint64_t slot = 0;      // this lane's value in the current SIMD exchange
  uint64_t result = 0;
};

struct Group {
  vec3<unsigned> tpig, tgpig, tpitg, tptg, tgpg;
  unsigned index = 0;  // linear index in the group
};

struct Launch {
  std::vector<Fiber> fibers;
  std::vector<Group> threads;
  ucontext_t sched;
  unsigned current = 0;
  std::function<void()> body;
  std::string error;
};

inline thread_local Launch* g_launch = nullptr;

inline Fiber& me() { return g_launch->fibers[g_launch->current]; }
inline const Group& my_ids() { return g_launch->threads[g_launch->current]; }

inline void yield_to_scheduler() {
  Launch* L = g_launch;
  swapcontext(&L->fibers[L->current].ctx, &L->sched);
}

inline void fiber_entry() {
  Launch* L = g_launch;
  L->body();
  L->fibers[L->current].wait = Wait::done;
  swapcontext(&L->fibers[L->current].ctx, &L->sched);
}

// Threadgroup memory: every ``threadgroup`` array registers itself here once, and is refilled
// with a garbage pattern before each group runs.
struct TgRegion { void* ptr; size_t bytes; };
inline std::vector<TgRegion>& tg_regions() { static std::vector<TgRegion> r; return r; }
template <typename A>
struct TgRegister {
  explicit TgRegister(A& a) { tg_regions().push_back({static_cast<void*>(&a), sizeof(A)}); }
};
inline void poison_threadgroup_memory() {
  for (auto& r : tg_regions()) std::memset(r.ptr, 0xff, r.bytes);  // NaN for floats, -1 for ints
}

}  // namespace metal_emu

// ---- Metal names the bodies use ---------------------------------------------------------------
using half = _Float16;
using bfloat16_t = metal_emu::bfloat16_t;
using bfloat = metal_emu::bfloat16_t;
using uint = unsigned int;
using uint2 = metal_emu::vec2<unsigned>;
using uint3 = metal_emu::vec3<unsigned>;
using int2 = metal_emu::vec2<int>;
using float2 = metal_emu::vec2<float>;

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }

namespace metal {
using std::abs; using std::ceil; using std::cos; using std::exp; using std::exp2;
using std::floor; using std::fma; using std::isinf; using std::isnan; using std::log;
using std::log2; using std::pow; using std::sin; using std::sqrt; using std::tanh;
template <typename A, typename B> inline auto max(A a, B b) { return a > b ? a : b; }
template <typename A, typename B> inline auto min(A a, B b) { return a < b ? a : b; }
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
template <typename A> inline A clamp(A x, A lo, A hi) { return x < lo ? lo : (x > hi ? hi : x); }
template <typename A> inline A select(A a, A b, bool c) { return c ? b : a; }
template <typename T> using numeric_limits = std::numeric_limits<T>;
namespace fast { using std::exp; using std::exp2; using std::log; using std::tanh;
                 using std::pow; using std::sqrt; }
namespace precise { using std::exp; using std::exp2; using std::log; using std::tanh;
                    using std::pow; using std::sqrt; }
}  // namespace metal


inline void threadgroup_barrier(mem_flags = mem_flags::mem_none) {
  auto& f = metal_emu::me();
  f.wait = metal_emu::Wait::barrier;
  metal_emu::yield_to_scheduler();
  f.barriers++;
}

inline void simdgroup_barrier(mem_flags = mem_flags::mem_none) {
  auto& f = metal_emu::me();
  f.wait = metal_emu::Wait::simd;
  metal_emu::yield_to_scheduler();
}

namespace metal_emu {
// One SIMD exchange: every active lane of the simdgroup posts ``v``; once all have, ``combine``
// runs over (lane, value) of the active lanes for each lane; the caller gets its own result.
template <typename T, typename F>
inline T simd_exchange(T v, F combine) {
  static_assert(sizeof(T) <= 8, "SIMD values up to 8 bytes");
  Launch* L = g_launch;
  unsigned self = L->current;
  Fiber& f = L->fibers[self];
  std::memcpy(&f.slot, &v, sizeof(T));
  f.wait = Wait::simd;
  yield_to_scheduler();  // the scheduler resumes us once every active lane has posted
  // every lane computes its result from the posted slots (which stay until all have read)
  unsigned base = L->threads[self].index / SIMD_WIDTH * SIMD_WIDTH;
  unsigned n = std::min<unsigned>(SIMD_WIDTH, unsigned(L->fibers.size()) - base);
  T vals[SIMD_WIDTH];
  bool active[SIMD_WIDTH];
  for (unsigned i = 0; i < n; i++) {
    Fiber& o = L->fibers[base + i];
    active[i] = o.wait != Wait::done;
    std::memcpy(&vals[i], &o.slot, sizeof(T));
  }
  for (unsigned i = n; i < SIMD_WIDTH; i++) active[i] = false;
  T out = combine(vals, active, L->threads[self].index - base);
  f.wait = Wait::simd;  // second phase: nobody overwrites a slot before every lane has read
  yield_to_scheduler();
  return out;
}
// max / min over the active lanes, the same for every lane; NaN only when every value is NaN.
template <typename T, typename Better>
inline T reduce_ignoring_nan(const T* x, const bool* a, Better better) {
  bool have = false;
  T m{};
  for (unsigned i = 0; i < SIMD_WIDTH; i++) {
    if (!a[i]) continue;
    if (!have || m != m || (x[i] == x[i] && better(m, x[i]))) m = x[i];
    have = true;
  }
  return m;
}
}  // namespace metal_emu

template <typename T>
inline T simd_sum(T v) {
  return metal_emu::simd_exchange(v, [](const T* x, const bool* a, unsigned) {
    float s = 0; for (unsigned i = 0; i < 32; i++) if (a[i]) s += float(x[i]); return T(s); });
}
template <typename T>
inline T simd_max(T v) {
  return metal_emu::simd_exchange(v, [](const T* x, const bool* a, unsigned) {
    return metal_emu::reduce_ignoring_nan(x, a, [](T u, T w) { return w > u; }); });
}
template <typename T>
inline T simd_min(T v) {
  return metal_emu::simd_exchange(v, [](const T* x, const bool* a, unsigned) {
    return metal_emu::reduce_ignoring_nan(x, a, [](T u, T w) { return w < u; }); });
}
template <typename T>
inline T simd_prefix_exclusive_sum(T v) {
  return metal_emu::simd_exchange(v, [](const T* x, const bool* a, unsigned lane) {
    float s = 0; for (unsigned i = 0; i < lane; i++) if (a[i]) s += float(x[i]); return T(s); });
}
template <typename T>
inline T simd_shuffle(T v, unsigned src) {
  return metal_emu::simd_exchange(v, [src](const T* x, const bool*, unsigned) { return x[src % 32]; });
}
template <typename T>
inline T simd_broadcast(T v, unsigned src) { return simd_shuffle(v, src); }
template <typename T>
inline T simd_shuffle_down(T v, unsigned d) {
  return metal_emu::simd_exchange(v, [d](const T* x, const bool*, unsigned lane) {
    return lane + d < 32 ? x[lane + d] : x[lane]; });
}
template <typename T>
inline T simd_shuffle_up(T v, unsigned d) {
  return metal_emu::simd_exchange(v, [d](const T* x, const bool*, unsigned lane) {
    return lane >= d ? x[lane - d] : x[lane]; });
}
template <typename T>
inline T simd_shuffle_xor(T v, unsigned m) {
  return metal_emu::simd_exchange(v, [m](const T* x, const bool*, unsigned lane) {
    return x[(lane ^ m) % 32]; });
}

namespace metal_emu {

// Runs ``body`` once per thread of the grid. Returns "" or what went wrong.
inline std::string launch(const unsigned grid[3], const unsigned tg[3], std::function<void()> body) {
  for (int d = 0; d < 3; d++) {
    if (tg[d] == 0 || grid[d] == 0) return "empty grid or threadgroup";
    if (grid[d] % tg[d]) return "grid not a multiple of the threadgroup (not emulated)";
  }
  unsigned size = tg[0] * tg[1] * tg[2];
  if (size > 1024) return "threadgroup larger than 1024 threads";
  Launch L;
  L.body = std::move(body);
  L.fibers.resize(size);
  L.threads.resize(size);
  Launch* saved = g_launch;
  g_launch = &L;
  unsigned ng[3] = {grid[0] / tg[0], grid[1] / tg[1], grid[2] / tg[2]};
  for (unsigned gz = 0; gz < ng[2] && L.error.empty(); gz++)
  for (unsigned gy = 0; gy < ng[1] && L.error.empty(); gy++)
  for (unsigned gx = 0; gx < ng[0] && L.error.empty(); gx++) {
    poison_threadgroup_memory();
    for (unsigned i = 0; i < size; i++) {
      unsigned x = i % tg[0], y = (i / tg[0]) % tg[1], z = i / (tg[0] * tg[1]);
      Group& g = L.threads[i];
      g.tpitg = {x, y, z};
      g.tgpig = {gx, gy, gz};
      g.tptg = {tg[0], tg[1], tg[2]};
      g.tgpg = {ng[0], ng[1], ng[2]};
      g.tpig = {gx * tg[0] + x, gy * tg[1] + y, gz * tg[2] + z};
      g.index = i;
      Fiber& f = L.fibers[i];
      f.wait = Wait::none;
      f.barriers = 0;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = stack_for(i);
      f.ctx.uc_stack.ss_size = STACK_BYTES;
      f.ctx.uc_link = nullptr;
      makecontext(&f.ctx, fiber_entry, 0);
    }
    // Run every runnable fiber until it waits or ends; then release whatever can go on.
    while (true) {
      for (unsigned i = 0; i < size; i++) {
        if (L.fibers[i].wait != Wait::none) continue;
        L.current = i;
        swapcontext(&L.sched, &L.fibers[i].ctx);
      }
      unsigned done = 0, at_barrier = 0;
      for (auto& f : L.fibers) {
        done += f.wait == Wait::done;
        at_barrier += f.wait == Wait::barrier;
      }
      if (done == size) break;
      bool progressed = false;
      // SIMD exchanges: a simdgroup whose active lanes all wait on one goes on.
      for (unsigned base = 0; base < size; base += SIMD_WIDTH) {
        unsigned end = std::min(size, base + SIMD_WIDTH), waiting = 0, active = 0;
        for (unsigned i = base; i < end; i++) {
          active += L.fibers[i].wait != Wait::done;
          waiting += L.fibers[i].wait == Wait::simd;
        }
        if (active && waiting == active) {
          for (unsigned i = base; i < end; i++)
            if (L.fibers[i].wait == Wait::simd) L.fibers[i].wait = Wait::none;
          progressed = true;
        }
      }
      if (progressed) continue;
      if (at_barrier == size - done && done > 0) {
        L.error = "threadgroup_barrier not reached by every thread of the group (some returned)";
        break;
      }
      if (at_barrier == size) {
        for (auto& f : L.fibers) f.wait = Wait::none;
        continue;
      }
      L.error = "deadlock: threads wait on different barriers / SIMD ops";
      break;
    }
  }
  g_launch = saved;
  return L.error;
}

}  // namespace metal_emu

// The current thread's position, as the attributes MLX declares for a body.
#define EMU_IDS                                                                         \
  const uint3 thread_position_in_grid = metal_emu::my_ids().tpig;                        \
  const uint3 threadgroup_position_in_grid = metal_emu::my_ids().tgpig;                  \
  const uint3 thread_position_in_threadgroup = metal_emu::my_ids().tpitg;                \
  const uint3 threads_per_threadgroup = metal_emu::my_ids().tptg;                        \
  const uint3 threadgroups_per_grid = metal_emu::my_ids().tgpg;                          \
  const uint thread_index_in_threadgroup = metal_emu::my_ids().index;                    \
  const uint thread_index_in_simdgroup = metal_emu::my_ids().index % 32;                 \
  const uint simdgroup_index_in_threadgroup = metal_emu::my_ids().index / 32;            \
  const uint threads_per_simdgroup = 32;                                                 \
  (void)thread_position_in_grid; (void)threadgroup_position_in_grid;                     \
  (void)thread_position_in_threadgroup; (void)threads_per_threadgroup;                   \
  (void)threadgroups_per_grid; (void)thread_index_in_threadgroup;                        \
  (void)thread_index_in_simdgroup; (void)simdgroup_index_in_threadgroup;                 \
  (void)threads_per_simdgroup;

// Address-space qualifiers: after this point the names are Metal's. (A ``threadgroup`` array
// declaration in a body is rewritten by the harness into a registered static; any other use of
// the qualifier, e.g. on a helper's pointer parameter, is empty.)
#define device
#define constant
#define thread
#define threadgroup
#define METAL_FUNC inline
