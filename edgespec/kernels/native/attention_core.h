// Tree attention on the CPU: N <= 64 query nodes (tree or chain) over L cached keys plus the
// nodes' own N keys, the mask computed from an ancestor bitmask, positions and a window
// (the layout of kernels/tree_mask.py's TreeMask and kernels/tree_attention.py's op).
//
// Contract (every ISA): for each item = h * N + i in [item0, item1): out[h, i, :] = softmax over
// the keys node i may see of scale * (q[h, i] . k[g, j]) (optionally softcap-ed), applied to
// v[g, j], with g = h / (H / H_kv). Node i sees cached key j < L when window == 0 or
// qpos[i] - (key_start + j) < window, and tree key t = j - L when bit t of anc[i] is set (and
// the window allows qpos[i] - qpos[t]). Keys are visited in index order and a hidden key adds
// an exact zero, so a node's result does not depend on which other nodes came with it (a
// verified token gets the bits plain decoding gives it). `scratch` holds S floats, or
// kTileQueries * S where the tiles apply (tiles_apply, on an ISA that has them).
#pragma once

#include <cstdint>

namespace edgespec_native {

struct AttnArgs {
  const float *q, *k, *v;
  float* out;
  const uint32_t* anc;  // (N, 2)
  const int32_t* qpos;  // (N,)
  int64_t N, S, L, H, Hkv, D, key_start, window;
  float scale, softcap;  // softcap 0: none
  int64_t q_h, q_n, k_h, k_t, v_h, v_t;  // strides in floats (the last axis is contiguous)
  // The nodes' own keys/values (key j >= L is row j - L here), when they are not rows L.. of
  // k and v (nullptr: they are); strides as above.
  const float *kt = nullptr, *vt = nullptr;
  int64_t kt_h = 0, kt_t = 0, vt_h = 0, vt_t = 0;
};

namespace {  // internal linkage: each ISA file compiles its own copy (see kernel.h)

// The most queries of one kv head the tile path (ATTN_TILE in attention_core.inc) attends to
// at once: 4 at a time in registers, each block of key and value rows read once for all of them.
constexpr int kTileQueries = 12;

// Kv head g's rows: the cached keys/values (row j < L at k + j * k_t) and the nodes' (row t at
// kt + t * kt_t), wherever AttnArgs keeps the latter.
struct KvHead {
  const float *k, *v, *kt, *vt;
  int64_t k_t, v_t, kt_t, vt_t;
};

inline KvHead kv_head(const AttnArgs& a, int64_t g) {
  const float* k = a.k + g * a.k_h;
  const float* v = a.v + g * a.v_h;
  const bool own = a.kt != nullptr;  // the nodes' rows in buffers of their own
  return {k, v, own ? a.kt + g * a.kt_h : k + a.L * a.k_t, own ? a.vt + g * a.vt_h : v + a.L * a.v_t,
          a.k_t, a.v_t, own ? a.kt_t : a.k_t, own ? a.vt_t : a.v_t};
}

// Whether ISA code that attends to several queries of a kv head at once (ATTN_TILE in
// attention_core.inc) takes these arguments: no window, no softcap, D a multiple of 16.
inline bool tiles_apply(const AttnArgs& a) {
  return a.window == 0 && a.softcap == 0.0f && a.D % 16 == 0;
}

}  // namespace

void attn_items_generic(const AttnArgs& a, float* scratch, int64_t item0, int64_t item1);
#if defined(__x86_64__) || defined(_M_X64)
void attn_items_avx2(const AttnArgs& a, float* scratch, int64_t item0, int64_t item1);
void attn_items_avx512(const AttnArgs& a, float* scratch, int64_t item0, int64_t item1);
#endif

}  // namespace edgespec_native
