// attention_core.inc compiled for avx2 (see CMakeLists.txt for its flags), with intrinsics for
// head sizes that are a multiple of 8: one key's score (ATTN_DOT: one 8-lane accumulator over
// the head by FMA, then sum256's tree), the softmax weights (ATTN_WEIGHTS), the weighted sum of
// values (ATTN_AV) and, for heads a multiple of 16 with no window and no softcap, up to
// kTileQueries queries of one kv head at once (ATTN_TILE, attention_tiles.inc: 4 queries x 2
// keys and 4 queries x 2 column vectors in registers, which with the rows loaded fit AVX2's 16).
// The tiles use the same steps as the one-query path, so a node's bits do not depend on the
// other nodes (tests/test_tree_attention_native.py, on every ISA the CPU has).
#include <immintrin.h>

#include "attention_core.h"
#include "avx2_sum.h"
#include "exp_neg.h"

namespace edgespec_native {
namespace {

// a . b over D (a multiple of 8): lane l accumulates d = l, l+8, ... by FMA, then sum256.
inline float dot8_one(const float* a, const float* b, int64_t D) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
  return sum256(acc);
}

inline float max256(__m256 v) {  // the largest lane (exact in any order)
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline __m256i first_lanes(int r) {  // lanes 0 .. r-1 set, for maskload / maskstore
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

#define VEC __m256
#define LANES 8
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps((p), (v))
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VSET1(s) _mm256_set1_ps(s)
#define VMUL(a, b) _mm256_mul_ps((a), (b))
#define VMAX(a, b) _mm256_max_ps((a), (b))
#define HMAX(v) max256(v)
#define VSUM4(a, b, c, d, out) sum4_256((a), (b), (c), (d), (out))
#define DOT1(q, k, D) dot8_one((q), (k), (D))
#define VADD(a, b) _mm256_add_ps((a), (b))
#define VSUB(a, b) _mm256_sub_ps((a), (b))
#define VFLOOR(v) _mm256_round_ps((v), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
#define VPOW2(n) \
  _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#define VLOAD_N(p, r) _mm256_maskload_ps((p), first_lanes(r))
#define VSTORE_N(p, r, v) _mm256_maskstore_ps((p), first_lanes(r), (v))
#define VKEEP_UNLESS(x, h, e) _mm256_and_ps(_mm256_cmp_ps((x), (h), _CMP_NEQ_OQ), (e))
#define KT 2
#define AVN 2
#include "attention_tiles.inc"

}  // namespace

#define ATTN_WEIGHTS(s, S, m, hidden) weights((s), (S), (m), (hidden))
#define ATTN_TILE(a, s, item, n, hidden) tile((a), (s), (item), (n), (hidden))
#define ATTN_AV(p, L, S, v, v_t, vt, vt_t, D, inv, out) \
  value_one((p), (L), (S), (v), (v_t), (vt), (vt_t), (D), (inv), (out))
#define ATTN_DOT(a, b, D) ((D) % 8 == 0 ? dot8_one((a), (b), (D)) : dot((a), (b), (D)))
#define ATTN_FN attn_items_avx2
#include "attention_core.inc"
}  // namespace edgespec_native
