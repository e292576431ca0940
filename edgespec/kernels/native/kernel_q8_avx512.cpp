// The int8-activation form of kernel_q.h's product on AVX-512 VNNI, compiled with -mavx512f
// -mavx512bw -mavx512vnni -mfma only (see kernel.h for why the ISA files include nothing else).
// x comes quantized per 32-value block in kernel_q.h's VNNI layout, groups of 4 rows
// (quantized_matmul.cpp's quantize_x8).
//
// A full group runs q8group: its lanes are (row, block), so one load of a round serves the group's
// 4 rows, and each column's step is unpacked once (the column's dwords of each round gathered by
// one permutation, masked or shifted for 4-bit nibbles, each round broadcast to the 4 row lanes)
// for up to 4 groups. Per row and column, a step is then 8 vpdpbusd (u8 x s8 -> int32, exact) and
// four float instructions (a convert, the group scales times the blocks' d, two FMAs: the scale
// part, and bias x d * sum(q)). The rows of a last partial group run q8block, in (column, block)
// lanes: the 4 columns' packed bytes rearranged in registers (a dword permutation per column, then
// a 4 x 4 transpose of 128-bit lanes), each row's rounds broadcast to the columns. Both compute
// every lane's value with the same instructions in the same order, so a row's bits depend neither
// on the other rows nor on which kernel ran it; each output's 4 block lanes are summed as (b0 +
// b2) + (b1 + b3). (Kept in registers across columns, x's rounds crowded the accumulators out of
// them: four groups take a column a pass.)
#include <immintrin.h>

#include <cstdint>

namespace edgespec_native {
namespace {

// How many 4-column quads ahead the packed rows are prefetched (as kernel_q_blocks.inc's
// kAhead for float x).
constexpr int64_t kAhead = 8;

inline __mmask64 byte_mask(int64_t n) {
  return n >= 64 ? ~__mmask64(0) : n <= 0 ? __mmask64(0) : (__mmask64(1) << n) - 1;
}

// c0..c3 (one column each, 128-bit lane e = that column's round e) into t[e], lane j = cj's lane e.
inline void lanes_transpose(const __m512i c[4], __m512i* t) {
  const __m512i u0 = _mm512_shuffle_i32x4(c[0], c[1], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i u1 = _mm512_shuffle_i32x4(c[0], c[1], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512i u2 = _mm512_shuffle_i32x4(c[2], c[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i u3 = _mm512_shuffle_i32x4(c[2], c[3], _MM_SHUFFLE(3, 2, 3, 2));
  t[0] = _mm512_shuffle_i32x4(u0, u2, _MM_SHUFFLE(2, 0, 2, 0));
  t[1] = _mm512_shuffle_i32x4(u0, u2, _MM_SHUFFLE(3, 1, 3, 1));
  t[2] = _mm512_shuffle_i32x4(u1, u3, _MM_SHUFFLE(2, 0, 2, 0));
  t[3] = _mm512_shuffle_i32x4(u1, u3, _MM_SHUFFLE(3, 1, 3, 1));
}

// The 8 round vectors of one step (values k.. k+127) of 4 columns at w (row stride ldq): lane
// (j, b) = 4 bytes of column j's block b (kernel_q.h's rounds).
template <int BITS>
inline void rounds(const uint8_t* w, int64_t ldq, int64_t k, int64_t K, __m512i r[8]) {
  const int64_t rem = K - k;  // values left, a multiple of 32
  __m512i c[4];
  if constexpr (BITS == 4) {
    // dword 4b + e of a column's 64 bytes to dword 4e + b
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __mmask64 m = byte_mask(rem / 2);
    for (int j = 0; j < 4; ++j)
      c[j] = _mm512_permutexvar_epi32(idx, _mm512_maskz_loadu_epi8(m, w + j * ldq + k / 2));
    __m512i t[4];
    lanes_transpose(c, t);
    const __m512i m4 = _mm512_set1_epi8(15);
    for (int e = 0; e < 4; ++e) {
      r[e] = _mm512_and_si512(t[e], m4);
      r[4 + e] = _mm512_and_si512(_mm512_srli_epi16(t[e], 4), m4);
    }
  } else {
    // dword 8b + e of a column's 128 bytes (two vectors, blocks 0-1 and 2-3) to dword 4e + b
    const __m512i lo = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(4));
    const __mmask64 ma = byte_mask(rem), mb = byte_mask(rem - 64);
    __m512i a[4], b[4];
    for (int j = 0; j < 4; ++j) {
      a[j] = _mm512_maskz_loadu_epi8(ma, w + j * ldq + k);
      b[j] = _mm512_maskz_loadu_epi8(mb, w + j * ldq + k + 64);
    }
    for (int j = 0; j < 4; ++j) c[j] = _mm512_permutex2var_epi32(a[j], lo, b[j]);
    lanes_transpose(c, r);
    for (int j = 0; j < 4; ++j) c[j] = _mm512_permutex2var_epi32(a[j], hi, b[j]);
    lanes_transpose(c, r + 4);
  }
}

// Lanes 4j .. 4j + n - 1 = v[j * ldg + g0 ..] for j < 4 (bits: n ones), the rest 0: float32
// scales or biases, or float16 ones (their bits as uint16_t), widened exactly.
inline __m512 quads(const float* v, int64_t ldg, int64_t g0, unsigned bits) {
  __m512 out = _mm512_setzero_ps();
  for (int j = 0; j < 4; ++j)
    out = _mm512_mask_loadu_ps(out, __mmask16(bits << (4 * j)), v + j * ldg + g0 - 4 * j);
  return out;
}

inline __m512 quads(const uint16_t* v, int64_t ldg, int64_t g0, unsigned bits) {
  __m512i h = _mm512_setzero_si512();
  for (int j = 0; j < 4; ++j)
    h = _mm512_mask_loadu_epi16(h, __mmask32(bits << (4 * j)), v + j * ldg + g0 - 4 * j);
  return _mm512_cvtph_ps(_mm512_castsi512_si256(h));
}

// v[0..3] in each 128-bit lane.
inline __m512 bcast4(const float* p) { return _mm512_broadcast_f32x4(_mm_loadu_ps(p)); }

inline __m512 bcast4(const uint16_t* p) {
  long long bits;
  __builtin_memcpy(&bits, p, 8);
  return _mm512_cvtph_ps(_mm256_set1_epi64x(bits));
}

// Lane (j, b) = v[j * ldg + group of block b] for the step at k (0 past K): the 4 columns'
// scales or biases of the step's groups (S: float, or uint16_t for float16).
template <typename S>
inline __m512 per_lane(const S* v, int64_t ldg, int64_t k, int64_t K, int64_t gs) {
  const int sh = gs == 32 ? 5 : gs == 64 ? 6 : 7;  // gs is 32, 64 or 128: shifts, not divisions
  const int64_t g0 = k >> sh, gpc = 128 >> sh, left = (K - k + gs - 1) >> sh;
  const unsigned n = unsigned(left < gpc ? left : gpc), bits = (1u << n) - 1u;
  const __m512 out = quads(v, ldg, g0, bits);
  if (gs == 32) return out;
  const int bsh = sh - 5;  // block b's group in the step: b >> bsh
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i j4 = _mm512_andnot_si512(_mm512_set1_epi32(3), lane);
  const __m512i b = _mm512_and_si512(lane, _mm512_set1_epi32(3));
  return _mm512_permutexvar_ps(_mm512_or_si512(j4, _mm512_srli_epi32(b, bsh)), out);
}

// The biases of a symmetric format (b null: kernel_q.h), -2^(bits - 1) times their scales:
// a multiply by a power of two, so the value the bias array holds.
inline __m512 bias_of(__m512 scales, int bits) {
  return _mm512_mul_ps(scales, _mm512_set1_ps(-float(1 << (bits - 1))));
}

// Each 128-bit lane's 4 block lanes summed as (b0 + b2) + (b1 + b3), into its first lane.
inline __m512 fold_blocks(__m512 a) {
  const __m512 t = _mm512_add_ps(a, _mm512_permute_ps(a, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1)));
}

inline __m512i bcast16(const int8_t* p) {
  return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The row layout of kernel_q.h's VNNI form: row i of a group at 16 * i bytes of each 64-byte
// round and 4 * i floats of each 16-float step of xd and xs.
constexpr int64_t kStepBytes = 512, kRoundBytes = 64, kStepFloats = 16;

// Rows 0..MB-1 (MB < 4) of one group of x against 4 columns in (column, block) lanes: the
// weights are rearranged once per step for these rows, each row's rounds broadcast to the 4
// columns: the rows past the full groups of 4 (q8columns).
template <int BITS, int MB, typename S>
inline void q8block(const int8_t* xr, const float* xd, const float* xs, const uint8_t* wq,
                    int64_t ldq, const S* s, const S* b, int64_t ldg, float* y,
                    int64_t ldy, int64_t K, int64_t gs, int nc, const uint8_t* pf,
                    int64_t pf_step) {
  __m512 acc[MB];
  #pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t k = 0, st = 0; k < K; k += 128, ++st) {
    if (pf != nullptr)  // this step's share of the packed rows kAhead quads on
      for (int64_t p = st * pf_step; p < (st + 1) * pf_step; p += 64)
        __builtin_prefetch(pf + p, 0, 2);
    __m512i r[8];
    rounds<BITS>(wq, ldq, k, K, r);
    const __m512 sv = per_lane(s, ldg, k, K, gs);
    const __m512 bv = b ? per_lane(b, ldg, k, K, gs) : bias_of(sv, BITS);
    // Two chains of vpdpbusd per row (rounds 0-3 and 4-7), the rows' chains interleaved; the
    // integer sums are exact, so the chaining changes no bit.
    const int8_t* x = xr + st * kStepBytes;
    __m512i d0[MB], d1[MB];
    #pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      d0[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), r[0], bcast16(x + 16 * i));
      d1[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), r[4],
                                  bcast16(x + 16 * i + 4 * kRoundBytes));
    }
    #pragma GCC unroll 8
    for (int e = 1; e < 4; ++e)
      #pragma GCC unroll 8
      for (int i = 0; i < MB; ++i) {
        d0[i] = _mm512_dpbusd_epi32(d0[i], r[e], bcast16(x + 16 * i + e * kRoundBytes));
        d1[i] = _mm512_dpbusd_epi32(d1[i], r[4 + e],
                                    bcast16(x + 16 * i + (4 + e) * kRoundBytes));
      }
    #pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      const int64_t f = st * kStepFloats + 4 * i;
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(d0[i], d1[i])),
                               _mm512_mul_ps(sv, bcast4(xd + f)), acc[i]);
      acc[i] = _mm512_fmadd_ps(bv, bcast4(xs + f), acc[i]);
    }
  }
  #pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) {  // a 128-bit lane per column
    alignas(64) float out[16];
    _mm512_store_ps(out, fold_blocks(acc[i]));
    #pragma GCC unroll 8
    for (int j = 0; j < nc; ++j) y[i * ldy + j] = out[4 * j];
  }
}

// 128-bit lane e of v broadcast to the 4 lanes.
template <int E>
inline __m512i lane_bcast(__m512i v) {
  return _mm512_shuffle_i32x4(v, v, E * 0x55);
}

// The 8 rounds of one column's step (values k .. k + 127) at w, each broadcast to the 4 row
// lanes: 128-bit lane (row i) dword b = 4 bytes of block b (kernel_q.h's rounds).
template <int BITS>
inline void column_rounds(const uint8_t* w, int64_t k, int64_t K, __m512i r[8]) {
  const int64_t rem = K - k;  // values left, a multiple of 32
  __m512i lo, hi;             // lane e: round e, round 4 + e
  if constexpr (BITS == 4) {
    // dword 4b + e of the column's 64 bytes to dword 4e + b, then the low and high nibbles
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i c =
        _mm512_permutexvar_epi32(idx, _mm512_maskz_loadu_epi8(byte_mask(rem / 2), w + k / 2));
    const __m512i m4 = _mm512_set1_epi8(15);
    lo = _mm512_and_si512(c, m4);
    hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
  } else {
    // dword 8b + e of the column's 128 bytes (blocks 0-1, 2-3) to dword 4e + b (e < 4: lo)
    const __m512i li = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
    const __m512i hix = _mm512_add_epi32(li, _mm512_set1_epi32(4));
    const __m512i a = _mm512_maskz_loadu_epi8(byte_mask(rem), w + k);
    const __m512i b = _mm512_maskz_loadu_epi8(byte_mask(rem - 64), w + k + 64);
    lo = _mm512_permutex2var_epi32(a, li, b);
    hi = _mm512_permutex2var_epi32(a, hix, b);
  }
  r[0] = lane_bcast<0>(lo), r[1] = lane_bcast<1>(lo), r[2] = lane_bcast<2>(lo);
  r[3] = lane_bcast<3>(lo), r[4] = lane_bcast<0>(hi), r[5] = lane_bcast<1>(hi);
  r[6] = lane_bcast<2>(hi), r[7] = lane_bcast<3>(hi);
}

// Lane (row i, block b) = v[the group of the step's block b] (0 past K): one column's scales
// or biases, the same for every row.
template <typename S>
inline __m512 column_lanes(const S* v, int64_t k, int64_t K, int64_t gs) {
  if (gs == 32 && K - k >= 128)  // the 4 groups of a whole step: one broadcast load
    return bcast4(v + (k >> 5));
  return per_lane(v, 0, k, K, gs);  // ldg 0: the one column in every lane
}

// G full groups of 4 rows (group stride ldr bytes, ldf floats) against NC columns (w, s, b
// with strides ldq, ldg) in (row, block) lanes: each column's step is unpacked once for the
// G groups and every round is one full load of 4 rows' x, so a row costs its vpdpbusd and
// four float instructions a column and step, and no broadcast. Each lane computes what
// q8block's (column, block) lane computes for that row, in the same order: the same bits.
// Only the first `rows` rows are stored: a last group padded with rows of zeros (q8columns).
template <int BITS, int G, int NC, typename S>
void q8group(const int8_t* xr, int64_t ldr, const float* xd, const float* xs, int64_t ldf,
             const uint8_t* wq, int64_t ldq, const S* s, const S* b, int64_t ldg,
             float* y, int64_t ldy, int64_t K, int64_t gs, const uint8_t* pf, int64_t pf_step,
             int64_t rows) {
  __m512 acc[NC][G];
  #pragma GCC unroll 8
  for (int j = 0; j < NC; ++j)
    #pragma GCC unroll 8
    for (int g = 0; g < G; ++g) acc[j][g] = _mm512_setzero_ps();
  for (int64_t k = 0, st = 0; k < K; k += 128, ++st) {
    if (pf != nullptr)
      for (int64_t p = st * pf_step; p < (st + 1) * pf_step; p += 64)
        __builtin_prefetch(pf + p, 0, 2);
    __m512 dv[G], sx[G];  // lane (row, block): d, and d * sum(q)
    #pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      dv[g] = _mm512_loadu_ps(xd + g * ldf + st * kStepFloats);
      sx[g] = _mm512_loadu_ps(xs + g * ldf + st * kStepFloats);
    }
    #pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) {
      __m512i r[8];
      column_rounds<BITS>(wq + j * ldq, k, K, r);
      const __m512 sv = column_lanes(s + j * ldg, k, K, gs);
      const __m512 bv = b ? column_lanes(b + j * ldg, k, K, gs) : bias_of(sv, BITS);
      #pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        const int8_t* x = xr + g * ldr + st * kStepBytes;
        const auto round = [x](int e) {
          return _mm512_loadu_si512(reinterpret_cast<const void*>(x + e * kRoundBytes));
        };
        __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), r[0], round(0));
        __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), r[4], round(4));
        #pragma GCC unroll 8
        for (int e = 1; e < 4; ++e) {
          d0 = _mm512_dpbusd_epi32(d0, r[e], round(e));
          d1 = _mm512_dpbusd_epi32(d1, r[4 + e], round(4 + e));
        }
        acc[j][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(d0, d1)),
                                    _mm512_mul_ps(sv, dv[g]), acc[j][g]);
        acc[j][g] = _mm512_fmadd_ps(bv, sx[g], acc[j][g]);
      }
    }
  }
  #pragma GCC unroll 8
  for (int j = 0; j < NC; ++j)
    #pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {  // a 128-bit lane per row
      alignas(64) float out[16];
      _mm512_store_ps(out, fold_blocks(acc[j][g]));
      #pragma GCC unroll 8
      for (int i = 0; i < 4; ++i)
        if (4 * g + i < rows) y[(4 * g + i) * ldy + j] = out[4 * i];
    }
}

// Rows 0..M-1 of x (kernel_q.h's VNNI layout: groups of 4 rows, ldr bytes and ldf floats
// apart) against 4 columns (w, s, b with strides ldq, ldg; 0: one column in every lane); nc
// columns of y written. The full groups run q8group up to four at a time (four: a column a
// pass). Past 4 rows a last partial group runs as a full one, its rows past M zeros
// (quantize_x8) computed and not stored: 5-7 rows then cost what 8 cost, where q8block's second
// pass over the weights cost more than a full group (docs/measurements.md, "A partial group
// run as a full one"). 1-3 rows run q8block. The same bits for a row either way.
template <int BITS, typename S>
void q8columns(const int8_t* xr, int64_t ldr, const float* xd, const float* xs, int64_t ldf,
               const uint8_t* w, int64_t ldq, const S* s, const S* b, int64_t ldg,
               float* y, int64_t ldy, int64_t M, int64_t K, int64_t gs, int nc) {
  // The first pass asks for the 4 packed rows kAhead quads on (contiguous: 4 ldq bytes),
  // spread over its steps (q8rows asks for their scales and biases): nothing else brings the
  // next weights in while this quad computes (a one-row product waited on its loads).
  const uint8_t* pf = ldq != 0 ? w + kAhead * 4 * ldq : nullptr;
  const int64_t steps = (K + 127) / 128, pf_step = (4 * ldq + steps * 64 - 1) / (steps * 64) * 64;
  const int64_t full = M > 4 ? (M + 3) / 4 : M / 4;
  for (int64_t g = 0, G; g < full; g += G, pf = nullptr) {
    G = full - g >= 4 ? 4 : full - g >= 2 ? 2 : 1;
    const int8_t* xg = xr + g * ldr;
    const float *dg = xd + g * ldf, *sg = xs + g * ldf;
    float* yg = y + 4 * g * ldy;
    const int64_t rows = M - 4 * g;
    if (nc == 4 && G == 2) {
      q8group<BITS, 2, 4, S>(xg, ldr, dg, sg, ldf, w, ldq, s, b, ldg, yg, ldy, K, gs, pf, pf_step,
                           rows);
      continue;
    }
    if (nc == 4 && G == 1) {
      q8group<BITS, 1, 4, S>(xg, ldr, dg, sg, ldf, w, ldq, s, b, ldg, yg, ldy, K, gs, pf, pf_step,
                           rows);
      continue;
    }
    for (int j = 0; j < nc; ++j) {  // four groups (or one column): a column a pass
      const uint8_t *wj = w + j * ldq, *pj = j == 0 ? pf : nullptr;
      const S *sj = s + j * ldg, *bj = b ? b + j * ldg : nullptr;
      if (G == 4)
        q8group<BITS, 4, 1, S>(xg, ldr, dg, sg, ldf, wj, ldq, sj, bj, ldg, yg + j, ldy, K, gs, pj,
                            pf_step, rows);
      else if (G == 2)
        q8group<BITS, 2, 1, S>(xg, ldr, dg, sg, ldf, wj, ldq, sj, bj, ldg, yg + j, ldy, K, gs, pj,
                            pf_step, rows);
      else
        q8group<BITS, 1, 1, S>(xg, ldr, dg, sg, ldf, wj, ldq, sj, bj, ldg, yg + j, ldy, K, gs, pj,
                            pf_step, rows);
    }
  }
  using Fn = void (*)(const int8_t*, const float*, const float*, const uint8_t*, int64_t,
                      const S*, const S*, int64_t, float*, int64_t, int64_t, int64_t, int,
                      const uint8_t*, int64_t);
  static constexpr Fn rest[] = {q8block<BITS, 1, S>, q8block<BITS, 2, S>, q8block<BITS, 3, S>};
  if (M > 0 && M < 4)
    rest[M - 1](xr, xd, xs, w, ldq, s, b, ldg, y, ldy, K, gs, nc, pf, pf_step);
}

#include "q8_rows.inc"

}  // namespace

void q8quantize_avx512(int bits, const float* x, int64_t ldx, int64_t M, int64_t K, int8_t* xr,
                       int64_t ldr, float* xd, float* xs, int64_t ldf) {
  const __m512 fmax = _mm512_set1_ps(3.40282347e38f), magic = _mm512_set1_ps(12582912.0f);
  // 4 bits: even values then odd ones in each 16-byte half (dwords e0 e1 e4 e5 | e2 e3 e6 e7)
  const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  static constexpr int kRound4[8] = {0, 1, 4, 5, 2, 3, 6, 7};  // dword i of the halves: round e
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
      const float* xb = x + m * ldx + k0;
      const __m512 a = _mm512_loadu_ps(xb), b = _mm512_loadu_ps(xb + 16);
      const __m512 aa = _mm512_abs_ps(a), ab = _mm512_abs_ps(b);
      const bool finite = _mm512_cmp_ps_mask(aa, fmax, _CMP_LE_OQ) == 0xFFFF &&
                          _mm512_cmp_ps_mask(ab, fmax, _CMP_LE_OQ) == 0xFFFF;
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(aa, ab));
      const float d = finite ? amax / 127.0f : __builtin_nanf("");
      __m512i qa = _mm512_setzero_si512(), qb = _mm512_setzero_si512();
      if (finite && d > 0.0f) {
        const __m512 dv = _mm512_set1_ps(d);
        qa = _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(_mm512_div_ps(a, dv), magic), magic));
        qb = _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(_mm512_div_ps(b, dv), magic), magic));
      }
      const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
      const int64_t st = k0 / 128, blk = (k0 % 128) / 32;
      __m128i lo = _mm512_cvtepi32_epi8(qa), hi = _mm512_cvtepi32_epi8(qb);
      if (bits == 4) {
        lo = _mm_shuffle_epi8(lo, split);
        hi = _mm_shuffle_epi8(hi, split);
      }
      alignas(16) int32_t dw[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(dw), lo);
      _mm_store_si128(reinterpret_cast<__m128i*>(dw + 4), hi);
      int8_t* step = xr + (m / 4) * ldr + st * kStepBytes + 16 * (m % 4) + 4 * blk;
      for (int i = 0; i < 8; ++i)
        __builtin_memcpy(step + kRoundBytes * (bits == 4 ? kRound4[i] : i), dw + i, 4);
      const int64_t f = (m / 4) * ldf + st * kStepFloats + 4 * (m % 4) + blk;
      xd[f] = d;
      xs[f] = d * static_cast<float>(sum);
    }
}

int32_t q8_dot_loop_avx512vnni(int64_t iters) {
  __m512i acc[12];
  // operands that depend on iters, so the compiler cannot fold the chains
  const __m512i a = _mm512_set1_epi8(static_cast<char>(1 + (iters & 1)));
  const __m512i b = _mm512_set1_epi8(static_cast<char>(1 + (iters & 2)));
  for (int c = 0; c < 12; ++c) acc[c] = _mm512_set1_epi32(c);
  for (int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < 12; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
  __m512i s = acc[0];
  for (int c = 1; c < 12; ++c) s = _mm512_add_epi32(s, acc[c]);
  return _mm512_reduce_add_epi32(s);
}

void q8rows_avx512vnni(int bits, const int8_t* xr, int64_t ldr, const float* xd, const float* xs,
                       int64_t ldf, const uint8_t* wq, int64_t ldq, const void* s,
                       const void* b, bool half, int64_t ldg, float* y, int64_t ldy, int64_t M,
                       int64_t K, int64_t gs, int64_t n0, int64_t n1) {
  q8rows_bits(bits, xr, ldr, xd, xs, ldf, wq, ldq, s, b, half, ldg, y, ldy, M, K, gs, n0, n1);
}

}  // namespace edgespec_native
