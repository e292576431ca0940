// accept_sampling: the lossless sampling rule (verify.verify_sampling_uniforms) on the device,
// given the uniforms the host drew.
//
// inputs:  p (N, V) float32: the target's filtered distribution after each node; q (N, V) or
//          (1, 1) float32: the drafter's (row u: what u's children were drawn from); tokens,
//          parents (N) int32; uniforms (N) float32: uniforms[c] decides child c's accept test,
//          uniforms[0] draws the bonus token; ip int32 [N, V, has_q]
// outputs: path (N) int32 (then -1); info (2) int32 [path length, bonus token];
//          resid (V) float32: scratch (the residual distribution)
// grid (256, 1, 1), threadgroup (256, 1, 1): one group walks the tree; the V-long updates are
// split over its threads. Child x of u with q: accepted iff uniform * q[u][x] < r[x] (r: the
// residual, p[u] at first), else r <- norm(max(0, r - q[u])); without q (or q[u][x] = 0):
// accepted iff uniform < r[x], else r <- norm(r with x removed). A residual summing to 0 stays.
// Bonus: the first index whose cumulative residual exceeds uniforms[0] * sum (inverse CDF).
constexpr uint TG = 256;
threadgroup float red[TG / 32];
threadgroup int cand[TG];
const uint t = thread_position_in_threadgroup.x;
const int N = ip[0], V = ip[1], has_q = ip[2];

int u = 0, n = 1;
if (t == 0) {
  path[0] = 0;
}
for (int y = int(t); y < V; y += int(TG)) {
  resid[y] = p[y];
}
threadgroup_barrier(mem_flags::mem_device);
while (true) {
  int chosen = -1;
  for (int c = u + 1; c < N; c++) {
    if (parents[c] != u) {
      continue;
    }
    const int x = tokens[c];
    const float qx = has_q != 0 ? q[size_t(u) * V + x] : 0.0f;
    const bool sampled = qx > 0.0f;
    const bool accepted = sampled ? uniforms[c] * qx < resid[x] : uniforms[c] < resid[x];
    threadgroup_barrier(mem_flags::mem_device);  // every thread has read resid[x] (it changes next)
    if (accepted) {
      chosen = c;
      break;
    }
    float part = 0.0f;
    for (int y = int(t); y < V; y += int(TG)) {
      part += sampled ? metal::max(resid[y] - q[size_t(u) * V + y], 0.0f)
                      : (y == x ? 0.0f : resid[y]);
    }
    const float total = edgespec_tg_sum(part, red, t, TG);
    if (total > 0.0f) {
      for (int y = int(t); y < V; y += int(TG)) {
        const float r = sampled ? metal::max(resid[y] - q[size_t(u) * V + y], 0.0f)
                                : (y == x ? 0.0f : resid[y]);
        resid[y] = r / total;
      }
    }
    threadgroup_barrier(mem_flags::mem_device);
  }
  if (chosen < 0) {
    break;
  }
  u = chosen;
  if (t == 0) {
    path[n] = u;
  }
  n++;
  for (int y = int(t); y < V; y += int(TG)) {
    resid[y] = p[size_t(u) * V + y];
  }
  threadgroup_barrier(mem_flags::mem_device);
}

// bonus token: inverse CDF over resid, each thread scanning one contiguous chunk
const int chunk = (V + int(TG) - 1) / int(TG);
const int lo = metal::min(V, int(t) * chunk), hi = metal::min(V, lo + chunk);
float mine = 0.0f;
for (int y = lo; y < hi; y++) {
  mine += resid[y];
}
const float before_in_simd = simd_prefix_exclusive_sum(mine);
const float simd_total = simd_sum(mine);
if (t % 32 == 0) {
  red[t / 32] = simd_total;
}
threadgroup_barrier(mem_flags::mem_threadgroup);
float before = before_in_simd, total = 0.0f;
for (uint k = 0; k < TG / 32; k++) {
  before += k < t / 32 ? red[k] : 0.0f;
  total += red[k];
}
const float target = uniforms[0] * total;
float running = before;
cand[t] = -1;
for (int y = lo; y < hi; y++) {
  running += resid[y];
  if (running > target) {
    cand[t] = y;
    break;
  }
}
threadgroup_barrier(mem_flags::mem_threadgroup);
if (t == 0) {
  int bonus = V - 1;
  for (uint k = 0; k < TG; k++) {
    if (cand[k] >= 0) {
      bonus = cand[k];
      break;
    }
  }
  for (int r = n; r < N; r++) {
    path[r] = -1;
  }
  info[0] = n;
  info[1] = bonus;
}
