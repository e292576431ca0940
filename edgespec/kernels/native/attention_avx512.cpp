// attention_core.inc compiled for avx512 (see CMakeLists.txt for its flags), with the scores of
// head sizes that are a multiple of 16 computed by intrinsics: one key's dot product (ATTN_DOT)
// and 16 keys' at once (ATTN_BLOCK16), both summing a key's 16 lanes in the same fixed tree
// (lanes l + l+8, then + l+4, + l+2, + l+1), so a key's score has the same bits whichever of
// the two computes it (plain decoding and verification see different cached-key counts and
// must agree bit for bit; tests/test_tree_attention_native.py checks it). 16 keys at once
// replace 16 horizontal sums by one transposing network.
#include <immintrin.h>

#include "attention_core.h"
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

// e^x for x <= 0, 16 at a time: exp_neg.h's steps (2^n by the exponent bits, 2^f by its Taylor
// series to degree 6, by FMA) as vector operations, so every key's weight has the same bits
// whichever lane it is in. The loop over exp_neg that GCC made of attention_core.inc's
// softmax took ~5 cycles a key (stop 23: a layer of the demo model, 16 nodes over 128 cached
// keys, one thread, min of 200: 154 -> 125 us).
inline __m512 exp_neg16(__m512 x) {
  const __m512 t = _mm512_max_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                 _mm512_set1_ps(-126.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_add_ps(t, _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945309f));
  constexpr float coef[6] = {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
  __m512 p = _mm512_set1_ps(1.0f / 720);
  for (int c = 0; c < 6; ++c) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(coef[c]));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

// s[j] = e^(s[j] - m), or 0 where s[j] == hidden; the last S % 16 by masked loads and stores.
inline void weights16(float* s, int64_t S, float m, float hidden) {
  const __m512 mv = _mm512_set1_ps(m), hv = _mm512_set1_ps(hidden);
  for (int64_t j = 0; j < S; j += 16) {
    const __mmask16 lanes = S - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (S - j)) - 1u);
    const __m512 x = _mm512_maskz_loadu_ps(lanes, s + j);
    const __mmask16 shown = _mm512_cmp_ps_mask(x, hv, _CMP_NEQ_OQ);
    _mm512_mask_storeu_ps(s + j, lanes, _mm512_maskz_mov_ps(shown, exp_neg16(_mm512_sub_ps(x, mv))));
  }
}

// out[d] = inv * sum_j p[j] v_j[d] (D a multiple of 16), v_j row j of v for j < L and row j - L
// of vt after: per 64 columns (or the last 16 at a time) the accumulators stay in registers over
// the keys, each column summed in key order by FMA.
template <int NV>
inline void av_columns(const float* p, int64_t L, int64_t S, const float* v, int64_t v_t,
                       const float* vt, int64_t vt_t, float inv, float* out) {
  __m512 acc[NV];
  for (int c = 0; c < NV; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < S; ++j) {
    if (p[j] == 0.0f) continue;  // hidden (or underflowed): adds exactly nothing
    const __m512 e = _mm512_set1_ps(p[j]);
    const float* row = j < L ? v + j * v_t : vt + (j - L) * vt_t;
    for (int c = 0; c < NV; ++c)
      acc[c] = _mm512_fmadd_ps(e, _mm512_loadu_ps(row + 16 * c), acc[c]);
  }
  const __m512 s = _mm512_set1_ps(inv);
  for (int c = 0; c < NV; ++c) _mm512_storeu_ps(out + 16 * c, _mm512_mul_ps(acc[c], s));
}

inline void av16(const float* p, int64_t L, int64_t S, const float* v, int64_t v_t,
                 const float* vt, int64_t vt_t, int64_t D, float inv, float* out) {
  int64_t d = 0;
  for (; d + 64 <= D; d += 64) av_columns<4>(p, L, S, v + d, v_t, vt + d, vt_t, inv, out + d);
  for (; d < D; d += 16) av_columns<1>(p, L, S, v + d, v_t, vt + d, vt_t, inv, out + d);
}


// Up to 4 queries of one kv head at once (the tile path, ATTN_TILE): with 128 cached keys and
// a 64-wide head a head's keys and values (2 x 32 KB) do not stay in L1, so one query at a time
// streamed them from L2 for every query, and that stream was what a query cost (~8 cycles a
// key for q . k and again for p . v). Here each key and value row loaded serves up to 4
// queries, and the four queries' softmax sums run side by side (stop 23, the case above:
// 125 -> 93 us). Every score and output has the bits of the one-query path: q . k by the same
// FMA order and tree (sums16), the weights by weights16, p . v summed in key order skipping
// p = 0.

// out[4 qi + u] = q_qi . k_u for 4 queries and the 4 keys at k (row stride ldk).
inline void dots4x4(const float* const (&q)[4], const float* k, int64_t ldk, int64_t D,
                    float* out) {
  __m512 acc[16];
  for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) {
    __m512 kv[4];
    for (int u = 0; u < 4; ++u) kv[u] = _mm512_loadu_ps(k + u * ldk + d);
    for (int qi = 0; qi < 4; ++qi) {
      const __m512 qv = _mm512_loadu_ps(q[qi] + d);
      for (int u = 0; u < 4; ++u) acc[qi * 4 + u] = _mm512_fmadd_ps(qv, kv[u], acc[qi * 4 + u]);
    }
  }
  sums16(acc, out);
}

// The raw scores of 4 queries (s[qi * ldS + j0 + j]) against n keys of one buffer.
inline void scores4(const float* const (&q)[4], const float* k, int64_t ldk, int64_t n,
                    int64_t D, float* s, int64_t ldS) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    float out[16];
    dots4x4(q, k + j * ldk, ldk, D, out);
    for (int qi = 0; qi < 4; ++qi)
      for (int u = 0; u < 4; ++u) s[qi * ldS + j + u] = out[qi * 4 + u];
  }
  for (; j < n; ++j)
    for (int qi = 0; qi < 4; ++qi) s[qi * ldS + j] = dot16_one(q[qi], k + j * ldk, D);
}

// out_qi[d] = inv_qi * sum_j p_qi[j] v_j[d] for 64 columns (NV = 4) or 16 (NV = 1) from d.
template <int NV>
inline void av4_columns(const float* p, int64_t ldS, int nq, int64_t L, int64_t S,
                        const float* v, int64_t v_t, const float* vt, int64_t vt_t,
                        const float (&inv)[4], float* const (&out)[4]) {
  __m512 acc[4][NV];
  for (int qi = 0; qi < 4; ++qi)
    for (int c = 0; c < NV; ++c) acc[qi][c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < S; ++j) {
    const float* row = j < L ? v + j * v_t : vt + (j - L) * vt_t;
    __m512 rv[NV];
    for (int c = 0; c < NV; ++c) rv[c] = _mm512_loadu_ps(row + 16 * c);
    for (int qi = 0; qi < 4; ++qi) {
      const float pj = p[qi * ldS + j];
      if (qi >= nq || pj == 0.0f) continue;  // hidden (or underflowed): adds exactly nothing
      const __m512 e = _mm512_set1_ps(pj);
      for (int c = 0; c < NV; ++c) acc[qi][c] = _mm512_fmadd_ps(e, rv[c], acc[qi][c]);
    }
  }
  for (int qi = 0; qi < nq; ++qi) {
    const __m512 sc = _mm512_set1_ps(inv[qi]);
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(out[qi] + 16 * c, _mm512_mul_ps(acc[qi][c], sc));
  }
}

// Items item0 .. item0 + nq - 1 (nq <= 4, one kv head; no window, no softcap, D a multiple of
// 16); s holds 4 * S floats; `hidden` is a hidden key's score.
inline void tile4(const AttnArgs& a, float* s, int64_t item0, int nq, float hidden) {
  const int64_t rep = a.H / a.Hkv, g = item0 / a.N / rep, S = a.S, L = a.L;
  const float* kb = a.k + g * a.k_h;
  const float* vb = a.v + g * a.v_h;
  const float* ktb = a.kt != nullptr ? a.kt + g * a.kt_h : kb + L * a.k_t;
  const float* vtb = a.vt != nullptr ? a.vt + g * a.vt_h : vb + L * a.v_t;
  const int64_t kt_t = a.kt != nullptr ? a.kt_t : a.k_t, vt_t = a.vt != nullptr ? a.vt_t : a.v_t;
  const float* q[4];
  float* out[4];
  int64_t node[4];
  for (int qi = 0; qi < 4; ++qi) {
    const int64_t item = item0 + (qi < nq ? qi : nq - 1);  // a short tile repeats its last
    const int64_t h = item / a.N;
    node[qi] = item % a.N;
    q[qi] = a.q + h * a.q_h + node[qi] * a.q_n;
    out[qi] = a.out + (h * a.N + node[qi]) * a.D;
  }
  scores4(q, kb, a.k_t, L, a.D, s, S);
  scores4(q, ktb, kt_t, S - L, a.D, s + L, S);
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int qi = 0; qi < nq; ++qi) {
    float* sq = s + qi * S;
    const uint32_t* anc = a.anc + node[qi] * 2;
    __m512 mv = _mm512_set1_ps(hidden);  // the max is exact in any order
    int64_t j = 0;
    for (; j + 16 <= L; j += 16) {  // cached keys: all seen
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(sq + j), scale);
      mv = _mm512_max_ps(mv, x);
      _mm512_storeu_ps(sq + j, x);
    }
    float m = _mm512_reduce_max_ps(mv);
    for (; j < S; ++j) {
      const int64_t t = j - L;
      const float x = j < L || ((anc[t >> 5] >> (t & 31)) & 1u) ? sq[j] * a.scale : hidden;
      m = x > m ? x : m;
      sq[j] = x;
    }
    weights16(sq, S, m, hidden);
  }
  float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f}, inv[4];
  for (int64_t j = 0; j < S; ++j)  // each query's sum in key order, the four side by side
    for (int qi = 0; qi < 4; ++qi) sum[qi] += s[qi * S + j];
  for (int qi = 0; qi < 4; ++qi) inv[qi] = 1.0f / sum[qi];
  int64_t d = 0;
  for (; d + 64 <= a.D; d += 64) {
    float* o[4] = {out[0] + d, out[1] + d, out[2] + d, out[3] + d};
    av4_columns<4>(s, S, nq, L, S, vb + d, a.v_t, vtb + d, vt_t, inv, o);
  }
  for (; d < a.D; d += 16) {
    float* o[4] = {out[0] + d, out[1] + d, out[2] + d, out[3] + d};
    av4_columns<1>(s, S, nq, L, S, vb + d, a.v_t, vtb + d, vt_t, inv, o);
  }
}
}  // namespace

#define ATTN_WEIGHTS(s, S, m, hidden) weights16((s), (S), (m), (hidden))
#define ATTN_TILE(a, s, item, n, hidden) tile4((a), (s), (item), (n), (hidden))
#define ATTN_AV(p, L, S, v, v_t, vt, vt_t, D, inv, out) \
  av16((p), (L), (S), (v), (v_t), (vt), (vt_t), (D), (inv), (out))
#define ATTN_DOT(a, b, D) ((D) % 16 == 0 ? dot16_one((a), (b), (D)) : dot((a), (b), (D)))
#define ATTN_BLOCK16(q, k, ldk, D, out) dot16_block((q), (k), (ldk), (D), (out))
#define ATTN_FN attn_items_avx512
#include "attention_core.inc"
}  // namespace edgespec_native
