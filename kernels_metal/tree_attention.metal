// tree_attention: softmax attention of N <= 64 tree nodes (B = 1) over L cached keys followed by
// the tree's own N keys, with the mask computed here (edgespec/kernels/tree_attention.py).
//
// inputs:  q (H, N, D) T; k, v (H_kv, L + N, D) T; anc (N, 2) uint32: bit t of node i's words
//          set when tree node t is i or an ancestor of i; qpos (N) int32: node positions;
//          ip int32 [N, S = L + N, L, H, H_kv, D, key_start, window (0: none)];
//          fp float32 [scale, softcap (0: none)]
// output:  out (H, N, D) T
// grid (32, N, H), threadgroup (32, 1, 1): one SIMD group per (node, query head).
// A cached key in slot j (position key_start + j) is visible to node i at position P iff
// key_start + j <= P and, with a window, P - (key_start + j) < window; tree key t iff t is an
// ancestor of i or i itself (and within the window). Scores in float32, online softmax over
// blocks of 32 keys (one key per lane for the dot product, then each lane owns D/32 features of
// the output). D <= 256.
constexpr int MAX_D = 256;
threadgroup float qs[MAX_D];
threadgroup float ps[32];
const uint lane = thread_index_in_simdgroup;
const int i = int(threadgroup_position_in_grid.y);
const int h = int(threadgroup_position_in_grid.z);
const int N = ip[0], S = ip[1], L = ip[2], H = ip[3], HKV = ip[4], D = ip[5];
const int key_start = ip[6], window = ip[7];
const float scale = fp[0], softcap = fp[1];
const int kvh = h / (H / HKV);

const device T* qrow = q + (size_t(h) * N + i) * D;
for (int d = int(lane); d < D; d += 32) {
  qs[d] = float(qrow[d]) * scale;
}
threadgroup_barrier(mem_flags::mem_threadgroup);

const int P = qpos[i];
const uint a0 = anc[2 * i], a1 = anc[2 * i + 1];
const device T* kb = k + size_t(kvh) * S * D;
const device T* vb = v + size_t(kvh) * S * D;
float m = -INFINITY, l = 0.0f;
float acc[MAX_D / 32];
for (int c = 0; c < MAX_D / 32; c++) {
  acc[c] = 0.0f;
}
for (int j0 = 0; j0 < S; j0 += 32) {
  const int j = j0 + int(lane);
  float s = -INFINITY;
  if (j < S) {
    bool visible;
    if (j < L) {
      const int p = key_start + j;
      visible = p <= P && (window <= 0 || P - p < window);
    } else {
      const int t = j - L;
      const uint word = t < 32 ? a0 : a1;
      visible = ((word >> uint(t & 31)) & 1u) != 0u;
      if (visible && window > 0) {
        visible = P - qpos[t] < window;
      }
    }
    if (visible) {
      const device T* krow = kb + size_t(j) * D;
      float dot = 0.0f;
      for (int d = 0; d < D; d++) {
        dot += qs[d] * float(krow[d]);
      }
      if (softcap > 0.0f) {
        dot = softcap * metal::precise::tanh(dot / softcap);
      }
      s = dot;
    }
  }
  const float bm = simd_max(s);
  if (bm == -INFINITY) {
    continue;  // the whole block is masked (the same decision in every lane)
  }
  const float mn = metal::max(m, bm);
  const float f = metal::exp(m - mn);
  const float p = metal::exp(s - mn);
  l = l * f + simd_sum(p);
  ps[lane] = p;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const int nb = metal::min(32, S - j0);
  for (int c = 0; c < MAX_D / 32; c++) {
    acc[c] *= f;
  }
  for (int jj = 0; jj < nb; jj++) {
    const float pj = ps[jj];
    if (pj == 0.0f) {
      continue;
    }
    const device T* vrow = vb + size_t(j0 + jj) * D;
    for (int c = 0; c < MAX_D / 32; c++) {
      const int d = int(lane) + 32 * c;
      if (d < D) {
        acc[c] += pj * float(vrow[d]);
      }
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  m = mn;
}
device T* orow = out + (size_t(h) * N + i) * D;
for (int c = 0; c < MAX_D / 32; c++) {
  const int d = int(lane) + 32 * c;
  if (d < D) {
    orow[d] = T(acc[c] / l);
  }
}
