// accept_greedy: the greedy acceptance walk (verify.verify_greedy) on the device.
//
// inputs:  argmax (N) int32: the target's greedy token after each node; parents (N) int32
//          (-1 for the root; parents precede children); tokens (N) int32; ip int32 [N]
// outputs: path (N) int32: accepted nodes from the root, then -1; info (2) int32 [path length,
//          bonus token]
// grid (64, 1, 1), threadgroup (64, 1, 1); N <= 64. Each thread marks whether its node matches
// its parent's argmax; thread 0 walks from the root to the first matching child (lowest index)
// of each accepted node.
threadgroup int match[64];
const uint t = thread_position_in_threadgroup.x;
const int N = ip[0];
if (int(t) < N) {
  match[t] = (t > 0 && tokens[t] == argmax[parents[t]]) ? 1 : 0;
}
threadgroup_barrier(mem_flags::mem_threadgroup);
if (t == 0) {
  int u = 0, n = 0;
  path[n++] = 0;
  while (true) {
    int next = -1;
    for (int c = u + 1; c < N; c++) {
      if (parents[c] == u && match[c] != 0) {
        next = c;
        break;
      }
    }
    if (next < 0) {
      break;
    }
    u = next;
    path[n++] = u;
  }
  for (int r = n; r < N; r++) {
    path[r] = -1;
  }
  info[0] = n;
  info[1] = argmax[u];
}
