// Helpers shared by the edgespec Metal kernels (passed as ``header=`` to mx.fast.metal_kernel,
// and included by the emulation harness the same way).

// Sum of ``x`` over the ``ntg`` threads of a threadgroup (every thread gets the total).
// ``red`` holds one float per SIMD group. Every thread of the group must call it.
inline float edgespec_tg_sum(float x, threadgroup float* red, uint t, uint ntg) {
  float s = simd_sum(x);
  if (t % 32 == 0) {
    red[t / 32] = s;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = 0.0f;
  for (uint k = 0; k < (ntg + 31) / 32; k++) {
    total += red[k];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return total;
}
