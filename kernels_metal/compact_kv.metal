// compact_kv: the accepted path's keys/values, gathered: out rows j = in rows rows[j].
//
// inputs:  keys (H_kv, S, D) T, values (H_kv, S, Dv) T (a layer's whole cache buffer, B = 1);
//          rows (n) int32: source slots (the committed length + the accepted node indices);
//          ip int32 [H_kv, S, D, Dv, n]
// outputs: kout (H_kv, n, D) T, vout (H_kv, n, Dv) T
// grid (32, n, H_kv), threadgroup (32, 1, 1). MLX's kernel outputs are new arrays (no aliasing
// of an input), so the kernel writes only the n moved rows; the cache then stores them after its
// committed prefix with one slice update (edgespec/kernels/compact.py).
const uint lane = thread_position_in_threadgroup.x;
const int j = int(threadgroup_position_in_grid.y);
const int h = int(threadgroup_position_in_grid.z);
const int S = ip[1], D = ip[2], DV = ip[3], n = ip[4];
const int src = rows[j];
for (int d = int(lane); d < D; d += 32) {
  kout[(size_t(h) * n + j) * D + d] = keys[(size_t(h) * S + src) * D + d];
}
for (int d = int(lane); d < DV; d += 32) {
  vout[(size_t(h) * n + j) * DV + d] = values[(size_t(h) * S + src) * DV + d];
}
