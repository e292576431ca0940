// attention_core.inc compiled for avx512 (see CMakeLists.txt for its flags), with the scores of
// head sizes that are a multiple of 16 computed by intrinsics: one key's dot product (ATTN_DOT)
// and 16 keys' at once (ATTN_BLOCK16), both summing a key's 16 lanes in the same fixed tree
// (lanes l + l+8, then + l+4, + l+2, + l+1), so a key's score has the same bits whichever of
// the two computes it (plain decoding and verification see different cached-key counts and
// must agree bit for bit; tests/test_tree_attention_native.py checks it). 16 keys at once
// replace 16 horizontal sums by one transposing network.
#include <immintrin.h>

#include "attention_core.h"
#include "avx512_sum.h"
#include "exp_neg.h"

namespace edgespec_native {
namespace {

// a . b over D (a multiple of 16): lane l accumulates d = l, l+16, ... by FMA, then the tree.
inline float dot16_one(const float* a, const float* b, int64_t D) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
  const __m256 lo = _mm512_castps512_ps256(acc);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
  const __m256 b8 = _mm256_add_ps(lo, hi);                                         // l + l+8
  const __m128 c4 = _mm_add_ps(_mm256_castps256_ps128(b8), _mm256_extractf128_ps(b8, 1));  // + l+4
  const __m128 d2 = _mm_add_ps(c4, _mm_movehl_ps(c4, c4));                         // + l+2
  return _mm_cvtss_f32(_mm_add_ss(d2, _mm_shuffle_ps(d2, d2, 1)));                 // + l+1
}

// out[t] = the sum of acc[t]'s lanes in dot16_one's tree, for 16 accumulators at once: one
// transposing network instead of 16 horizontal sums.
inline void sums16(const __m512 (&acc)[16], float* out) {
  __m512 T[8], U[4], V[2];
  for (int i = 0; i < 8; ++i)  // [b of key 2i | b of key 2i+1], b[l] = acc[l] + acc[l+8]
    T[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // block r: c of key 4i+r, c[l] = b[l] + b[l+4]
    U[i] = _mm512_add_ps(_mm512_shuffle_f32x4(T[2 * i], T[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(T[2 * i], T[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // block r: d of keys 8i+r, 8i+4+r; d[l] = c[l] + c[l+2]
    V[i] = _mm512_add_ps(_mm512_shuffle_ps(U[2 * i], U[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(U[2 * i], U[2 * i + 1], 0xEE));
  // block r, position p: key r + 4p, d0 + d1
  const __m512 E = _mm512_add_ps(_mm512_shuffle_ps(V[0], V[1], 0x88),
                                 _mm512_shuffle_ps(V[0], V[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, E));
}

// out[t] = q . k[t * ldk] for 16 keys, the same tree per key as dot16_one.
inline void dot16_block(const float* q, const float* k, int64_t ldk, int64_t D, float* out) {
  __m512 acc[16];
  for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) {
    const __m512 qv = _mm512_loadu_ps(q + d);
    for (int t = 0; t < 16; ++t) acc[t] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + t * ldk + d), acc[t]);
  }
  sums16(acc, out);
}

#define VEC __m512
#define LANES 16
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps((p), (v))
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VSET1(s) _mm512_set1_ps(s)
#define VMUL(a, b) _mm512_mul_ps((a), (b))
#define VMAX(a, b) _mm512_max_ps((a), (b))
#define HMAX(v) _mm512_reduce_max_ps(v)
#define VSUM4(a, b, c, d, out) sum4_512((a), (b), (c), (d), (out))
#define DOT1(q, k, D) dot16_one((q), (k), (D))
#define VADD(a, b) _mm512_add_ps((a), (b))
#define VSUB(a, b) _mm512_sub_ps((a), (b))
#define VFLOOR(v) _mm512_roundscale_ps((v), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
#define VPOW2(n) \
  _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#define VLOAD_N(p, r) _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << (r)) - 1u), (p))
#define VSTORE_N(p, r, v) _mm512_mask_storeu_ps((p), static_cast<__mmask16>((1u << (r)) - 1u), (v))
#define VKEEP_UNLESS(x, h, e) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask((x), (h), _CMP_NEQ_OQ), (e))
#define KT 4
#define AVN 4
#include "attention_tiles.inc"

}  // namespace

#define ATTN_WEIGHTS(s, S, m, hidden) weights((s), (S), (m), (hidden))
#define ATTN_TILE(a, s, item, n, hidden) tile((a), (s), (item), (n), (hidden))
#define ATTN_AV(p, L, S, v, v_t, vt, vt_t, D, inv, out) \
  value_one((p), (L), (S), (v), (v_t), (vt), (vt_t), (D), (inv), (out))
#define ATTN_DOT(a, b, D) ((D) % 16 == 0 ? dot16_one((a), (b), (D)) : dot((a), (b), (D)))
#define ATTN_BLOCK16(q, k, ldk, D, out) dot16_block((q), (k), (ldk), (D), (out))
#define ATTN_FN attn_items_avx512
#include "attention_core.inc"
}  // namespace edgespec_native
