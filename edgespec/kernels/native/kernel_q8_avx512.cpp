// The int8-activation form of kernel_q.h's product on AVX-512 VNNI, compiled with -mavx512f
// -mavx512bw -mavx512vnni -mfma only (see kernel.h for why the ISA files include nothing else).
//
// x comes per row in kernel_q.h's lane layout and runs q8lanes: each column's packed bytes are
// used as they are loaded (the 4-bit low and high nibbles masked and shifted in place; an 8-bit
// step's block halves paired by one qword permutation), each row's x laid out by the quantizer
// to match, so a column's step is 2 vpdpbusd a row into lanes (block, 4 values) and one load of
// x serves 4 columns. The 4 columns' lanes are summed into (block, column) lanes by in-lane
// unpacks and integer adds (exact), then a row's float instructions: a convert, the group
// scales times the blocks' d, two FMAs (the scale part, and bias x d * sum(q)). Rows run in
// passes of up to 8 over each quad of columns, whose weights are unpacked once a pass. (An
// earlier form for 4 rows or more laid x out in groups of 4 rows and broadcast each unpacked
// round of the weights to them: its loads of x, 2 a row and column, made it slower than these
// passes at every row count: docs/measurements.md, "Every row count in lanes".)
//
// Every (row, column, block) value gets the same float instructions in the same order, so a
// row's bits depend neither on the other rows nor on the pass it runs in; each output's 4 block
// lanes are summed as (b0 + b2) + (b1 + b3).
#include <immintrin.h>

#include <cstdint>

#include "kernel_q.h"  // declarations and one constant only: nothing compiled for this ISA

namespace edgespec_native {
namespace {

// How many 4-column quads ahead the packed rows are prefetched (as kernel_q_blocks.inc's
// kAhead for float x).
constexpr int64_t kAhead = 8;

// The most rows q8lanes takes in one pass over a quad of columns (its accumulators, the quad's
// unpacked weights and a row's temporaries fill the 32 vector registers).
constexpr int64_t kPassRows = 8;

inline __mmask64 byte_mask(int64_t n) {
  return n >= 64 ? ~__mmask64(0) : n <= 0 ? __mmask64(0) : (__mmask64(1) << n) - 1;
}

// Lanes 4j .. 4j + n - 1 = v[j * ldg + g0 ..] for j < 4 (bits: n ones), the rest 0: float32
// scales or biases, or float16 ones (their bits as uint16_t), widened exactly.
inline __m512 quads(const float* v, int64_t ldg, int64_t g0, unsigned bits) {
  if (bits == 15u) {  // 4 values a column: plain loads (the masked ones below form a chain)
    __m512 out = _mm512_castps128_ps512(_mm_loadu_ps(v + g0));
    out = _mm512_insertf32x4(out, _mm_loadu_ps(v + ldg + g0), 1);
    out = _mm512_insertf32x4(out, _mm_loadu_ps(v + 2 * ldg + g0), 2);
    return _mm512_insertf32x4(out, _mm_loadu_ps(v + 3 * ldg + g0), 3);
  }
  __m512 out = _mm512_setzero_ps();
  for (int j = 0; j < 4; ++j)
    out = _mm512_mask_loadu_ps(out, __mmask16(bits << (4 * j)), v + j * ldg + g0 - 4 * j);
  return out;
}

inline __m512 quads(const uint16_t* v, int64_t ldg, int64_t g0, unsigned bits) {
  if (bits == 15u) {
    const __m128i a0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + g0));
    const __m128i a1 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + ldg + g0));
    const __m128i a2 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + 2 * ldg + g0));
    const __m128i a3 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + 3 * ldg + g0));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_unpacklo_epi64(a0, a1)), _mm_unpacklo_epi64(a2, a3), 1));
  }
  __m512i h = _mm512_setzero_si512();
  for (int j = 0; j < 4; ++j)
    h = _mm512_mask_loadu_epi16(h, __mmask32(bits << (4 * j)), v + j * ldg + g0 - 4 * j);
  return _mm512_cvtph_ps(_mm512_castsi512_si256(h));
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

// kernel_q.h's lane layout: a row's step is two 64-byte vectors and 32 floats (16 of d, 16 of
// d * sum(q)).
constexpr int64_t kLaneStepBytes = 128, kLaneStepFloats = 32;

// The permutation index that moves dword 4a + b of a vector to dword 4b + a (a 4 x 4 transpose
// of dwords).
inline __m512i transposed_dwords() {
  return _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
}

// A column's step (values k .. k + 127) as q8lanes uses it: 4 bits: the low nibbles of its 64
// bytes, then the high ones (dword w: values 8w + 0, 2, 4, 6, then 8w + 1, 3, 5, 7); 8 bits: each
// block's first 16 bytes, then its last 16 (128-bit lane b: block b). Either way dword 4b + e of
// the two vectors holds block b's values of rounds e and 4 + e (kernel_q.h's lane layout).
template <int BITS>
inline void lane_weights(const uint8_t* w, int64_t k, int64_t K, __m512i out[2]) {
  const int64_t rem = K - k;  // values left, a multiple of 32
  if constexpr (BITS == 4) {
    const __m512i c = _mm512_maskz_loadu_epi8(byte_mask(rem / 2), w + k / 2);
    const __m512i m4 = _mm512_set1_epi8(15);
    out[0] = _mm512_and_si512(c, m4);
    out[1] = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
  } else {
    const __m512i lo = _mm512_maskz_loadu_epi8(byte_mask(rem), w + k);
    const __m512i hi = _mm512_maskz_loadu_epi8(byte_mask(rem - 64), w + k + 64);
    out[0] = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), hi);
    out[1] = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15), hi);
  }
}

// Lane 4b + j = lane 4j + b of v: (column, block) lanes to (block, column) ones.
inline __m512 to_block_lanes(__m512 v) { return _mm512_permutexvar_ps(transposed_dwords(), v); }

// Lane 4b + j = v[j * ldg + the group of the step's block b] (0 past K): the 4 columns'
// scales or biases of the step at k. Float16 ones of groups of 32 or 64 on a whole step (the
// GGUF and MLX formats) are gathered with in-lane unpacks; the rest as per_lane gives them.
inline __m512 block_lanes(const uint16_t* v, int64_t ldg, int64_t k, int64_t K, int64_t gs) {
  if (K - k >= 128 && (gs == 32 || gs == 64)) {
    const int64_t g = gs == 32 ? k >> 5 : k >> 6;
    __m128i a[4];
    for (int j = 0; j < 4; ++j) {
      int two;  // a group of 64's step: the column's 2 scales
      if (gs == 64) __builtin_memcpy(&two, v + j * ldg + g, sizeof(two));
      a[j] = gs == 32 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + j * ldg + g))
                      : _mm_cvtsi32_si128(two);
    }
    const __m128i p01 = _mm_unpacklo_epi16(a[0], a[1]), p23 = _mm_unpacklo_epi16(a[2], a[3]);
    const __m128i lo = _mm_unpacklo_epi32(p01, p23);  // groups 0, 1 of the 4 columns
    if (gs == 64)  // blocks 0, 1 in group 0; 2, 3 in group 1
      return _mm512_cvtph_ps(_mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_unpacklo_epi64(lo, lo)), _mm_unpackhi_epi64(lo, lo), 1));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo),
                                                   _mm_unpackhi_epi32(p01, p23), 1));
  }
  return to_block_lanes(per_lane(v, ldg, k, K, gs));
}

inline __m512 block_lanes(const float* v, int64_t ldg, int64_t k, int64_t K, int64_t gs) {
  return to_block_lanes(per_lane(v, ldg, k, K, gs));
}

// Rows 0..MB-1 (MB <= kPassRows) of x in kernel_q.h's lane layout (xr: row stride ldr bytes;
// xd: row stride ldf floats) against 4 columns (w, s, b with strides ldq, ldg; 0: one column in
// every lane) in (block, column) lanes; nc columns of y written. A column's step is 2 chained
// vpdpbusd a row (lanes: block, 4 values); the 4 columns' results are summed into (block,
// column) lanes by in-lane unpacks and integer adds, then a row's float instructions.
template <int BITS, int MB, typename S>
inline void q8lanes(const int8_t* xr, int64_t ldr, const float* xd, int64_t ldf,
                    const uint8_t* wq, int64_t ldq, const S* s, const S* b, int64_t ldg,
                    float* y, int64_t ldy, int64_t K, int64_t gs, int nc, const uint8_t* pf,
                    int64_t pf_step) {
  __m512 acc[MB];
  #pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t k = 0, st = 0; k < K; k += 128, ++st) {
    if (pf != nullptr)  // this step's share of the packed rows kAhead quads on
      for (int64_t p = st * pf_step; p < (st + 1) * pf_step; p += 64)
        __builtin_prefetch(pf + p, 0, 2);
    __m512i w[4][2];
    #pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) lane_weights<BITS>(wq + j * ldq, k, K, w[j]);
    const __m512 sv = block_lanes(s, ldg, k, K, gs);
    const __m512 bv = b ? block_lanes(b, ldg, k, K, gs) : bias_of(sv, BITS);
    #pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      const int8_t* x = xr + i * ldr + st * kLaneStepBytes;
      const float* f = xd + i * ldf + st * kLaneStepFloats;
      const __m512i x0 = _mm512_loadu_si512(x), x1 = _mm512_loadu_si512(x + 64);
      __m512i v[4];
      #pragma GCC unroll 4
      for (int j = 0; j < 4; ++j)
        v[j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w[j][0], x0),
                                   w[j][1], x1);
      // 128-bit lane b: [v0, v1, v0, v1] of rounds (0 + 2, 1 + 3), then v2, v3; then columns
      const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]),
                                           _mm512_unpackhi_epi32(v[0], v[1]));
      const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]),
                                           _mm512_unpackhi_epi32(v[2], v[3]));
      const __m512i dots = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23),
                                            _mm512_unpackhi_epi64(s01, s23));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), _mm512_mul_ps(sv, _mm512_loadu_ps(f)),
                               acc[i]);
      acc[i] = _mm512_fmadd_ps(bv, _mm512_loadu_ps(f + 16), acc[i]);
    }
  }
  #pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) {  // (b0 + b2) + (b1 + b3)
    const __m512 t =
        _mm512_add_ps(acc[i], _mm512_shuffle_f32x4(acc[i], acc[i], _MM_SHUFFLE(1, 0, 3, 2)));
    const __m512 u = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, _MM_SHUFFLE(2, 3, 0, 1)));
    _mm512_mask_storeu_ps(y + i * ldy, __mmask16((1u << nc) - 1), u);  // lanes 0..nc-1
  }
}

// Rows 0..M-1 of x (kernel_q.h's lane layout: ldr bytes and ldf floats a row; xs unread: the
// layout keeps d * sum(q) in xd) against 4 columns (w, s, b with strides ldq, ldg; 0: one
// column in every lane); nc columns of y written. The rows run through q8lanes in passes of up
// to kPassRows, each over the same quad of columns (in the cache after the first).
template <int BITS, typename S>
void q8columns(const int8_t* xr, int64_t ldr, const float* xd, const float* /*xs*/,
               int64_t ldf, const uint8_t* w, int64_t ldq, const S* s, const S* b, int64_t ldg,
               float* y, int64_t ldy, int64_t M, int64_t K, int64_t gs, int nc) {
  // The first pass asks for the 4 packed rows kAhead quads on (contiguous: 4 ldq bytes),
  // spread over its steps (q8rows asks for their scales and biases): nothing else brings the
  // next weights in while this quad computes (a one-row product waited on its loads).
  const uint8_t* pf = ldq != 0 ? w + kAhead * 4 * ldq : nullptr;
  const int64_t steps = (K + 127) / 128, pf_step = (4 * ldq + steps * 64 - 1) / (steps * 64) * 64;
  using Fn = void (*)(const int8_t*, int64_t, const float*, int64_t, const uint8_t*, int64_t,
                      const S*, const S*, int64_t, float*, int64_t, int64_t, int64_t, int,
                      const uint8_t*, int64_t);
  static constexpr Fn pass[kPassRows] = {
      q8lanes<BITS, 1, S>, q8lanes<BITS, 2, S>, q8lanes<BITS, 3, S>, q8lanes<BITS, 4, S>,
      q8lanes<BITS, 5, S>, q8lanes<BITS, 6, S>, q8lanes<BITS, 7, S>, q8lanes<BITS, 8, S>};
  for (int64_t r = 0; r < M; r += kPassRows, pf = nullptr) {
    const int64_t rows = M - r < kPassRows ? M - r : kPassRows;
    pass[rows - 1](xr + r * ldr, ldr, xd + r * ldf, ldf, w, ldq, s, b, ldg, y + r * ldy, ldy, K,
                   gs, nc, pf, pf_step);
  }
}

#include "q8_rows.inc"

// The wide form, for kQ8WideRows rows or more (kernel_q.h): 16 columns at a time in column
// lanes. Their packed weights are turned, once for all rows, into vectors whose lane c holds 4
// bytes of column c (a 16 x 16 transpose of dwords; 4 bits then split into low and high
// nibbles), so that each vpdpbusd takes one broadcast dword of a row's x and sums straight into
// the 16 columns' lanes: a row's block is 8 vpdpbusd, then its float instructions, with no
// per-row unpacking. The integers are the same block sums as q8lanes makes, and every
// (row, column, block) gets q8lanes' float instructions in its order, so the bits are too.

// The most steps (128 values) whose column-lane weights are made at once: 32 vectors a step,
// 16 KB for 8.
constexpr int64_t kWideSteps = 8;
// Rows a pass of the wide form carries: 4 accumulators each (one per block of a step) and a
// block's integer sums fill the vector registers with the weights and scales.
constexpr int64_t kWideRowsPerPass = 4;
// How many 16-column blocks ahead the packed rows are prefetched.
constexpr int64_t kWideAhead = 2;
// The most rows whose accumulators are kept between chunks of K (spilled to the stack).
constexpr int64_t kWideMaxRows = 32;

// out[j] lane i = dword j of v[i] (a 16 x 16 transpose of dwords).
inline void transpose16(__m512i v[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + p], 128-bit lane L: dword 4L + p of v[4i .. 4i + 3]
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int p = 0; p < 4; ++p) {  // 128-bit lane L of u[p], u[4 + p], .. to out[4L + p]
    const __m512i v0 = _mm512_shuffle_i32x4(u[p], u[4 + p], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i v1 = _mm512_shuffle_i32x4(u[p], u[4 + p], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + p], u[12 + p], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + p], u[12 + p], _MM_SHUFFLE(3, 2, 3, 2));
    v[p] = _mm512_shuffle_i32x4(v0, v2, _MM_SHUFFLE(2, 0, 2, 0));
    v[4 + p] = _mm512_shuffle_i32x4(v0, v2, _MM_SHUFFLE(3, 1, 3, 1));
    v[8 + p] = _mm512_shuffle_i32x4(v1, v3, _MM_SHUFFLE(2, 0, 2, 0));
    v[12 + p] = _mm512_shuffle_i32x4(v1, v3, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// v[j] lane i = dword j of the n bytes at p + i * ld (0 past n): 16 rows' first 64 bytes.
inline void lanes_of(const uint8_t* p, int64_t ld, int64_t n, __m512i v[16]) {
  const __mmask64 m = byte_mask(n);
  for (int i = 0; i < 16; ++i) v[i] = _mm512_maskz_loadu_epi8(m, p + i * ld);
  transpose16(v);
}

// The 16 columns' weights for steps st0 .. st1 - 1 (values st * 128 ..) in column lanes: out
// (32 vectors a step) vector 8b + e holds, in lane c, column c's 4 values of round e of block b
// (kernel_q.h's rounds, as the lane layout of x holds them).
// pf: null, or bytes to ask for, pf_step a step, spread over the steps (the next columns'
// packed rows: nothing else brings them in while these compute).
template <int BITS>
inline void wide_weights(const uint8_t* w, int64_t ldq, int64_t st0, int64_t st1, int64_t K,
                         __m512i* out, const uint8_t* pf, int64_t pf_step) {
  for (int64_t st = st0; st < st1; ++st, out += 32) {
    if (pf != nullptr)
      for (int64_t p = st * pf_step; p < (st + 1) * pf_step; p += 64)
        __builtin_prefetch(pf + p, 0, 2);
    const int64_t k = st * 128, rem = K - k;  // values left, a multiple of 32
    __m512i v[16];
    if constexpr (BITS == 4) {  // dword w: block w / 4, low nibbles round w % 4, high 4 + w % 4
      lanes_of(w + k / 2, ldq, rem / 2, v);
      const __m512i m4 = _mm512_set1_epi8(15);
      for (int d = 0; d < 16; ++d) {
        const int b = d / 4, e = d % 4;
        out[8 * b + e] = _mm512_and_si512(v[d], m4);
        out[8 * b + 4 + e] = _mm512_and_si512(_mm512_srli_epi16(v[d], 4), m4);
      }
    } else {  // dword u: block u / 8, round u % 8
      lanes_of(w + k, ldq, rem, v);
      for (int d = 0; d < 16; ++d) out[d] = v[d];
      if (rem > 64) {
        lanes_of(w + k + 64, ldq, rem - 64, v);
        for (int d = 0; d < 16; ++d) out[16 + d] = v[d];
      }
    }
  }
}

// out[g - g0] lane c = v[c * ldg + g] for groups g0 <= g < g1 (g1 - g0 <= 32): the 16 columns'
// scales or biases in column lanes, widened exactly from float16.
inline void wide_groups(const float* v, int64_t ldg, int64_t g0, int64_t g1, __m512* out) {
  for (int64_t g = g0; g < g1; g += 16) {
    __m512i t[16];
    lanes_of(reinterpret_cast<const uint8_t*>(v + g), ldg * 4, (g1 - g) * 4, t);
    for (int64_t j = 0; j < 16 && g + j < g1; ++j) out[g - g0 + j] = _mm512_castsi512_ps(t[j]);
  }
}

inline void wide_groups(const uint16_t* v, int64_t ldg, int64_t g0, int64_t g1, __m512* out) {
  __m512i t[16];  // dword j: groups g0 + 2j (low half) and g0 + 2j + 1
  lanes_of(reinterpret_cast<const uint8_t*>(v + g0), ldg * 2, (g1 - g0) * 2, t);
  for (int64_t j = 0; 2 * j < g1 - g0; ++j) {
    out[2 * j] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(t[j]));
    if (2 * j + 1 < g1 - g0)
      out[2 * j + 1] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(t[j], 16)));
  }
}

// Rows 0..R-1 of x (lane layout) over steps st0 .. st1 - 1 against 16 columns' column-lane
// weights (wv: 32 vectors a step from st0), scales and biases (sv, bv: a vector a group from
// group g0). The rows' 4 accumulators (lane c: column c; one per block position of a step)
// start at 0 on the first chunk of K, else come from acc; after the last chunk each row's 16
// outputs go to y as (b0 + b2) + (b1 + b3), else the accumulators go back to acc.
template <int R>
inline void wide_pass(const int8_t* xr, int64_t ldr, const float* xd, int64_t ldf,
                      const __m512i* wv, const __m512* sv, const __m512* bv, int64_t g0,
                      int64_t st0, int64_t st1, int64_t steps, int64_t K, int64_t gs,
                      __m512* acc, float* y, int64_t ldy) {
  __m512 a[R][4];
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 4
    for (int b = 0; b < 4; ++b) a[r][b] = st0 == 0 ? _mm512_setzero_ps() : acc[4 * r + b];
  const int sh = gs == 32 ? 5 : gs == 64 ? 6 : 7;
  for (int64_t st = st0; st < st1; ++st, wv += 32) {
    const int64_t k = st * 128, nb = (K - k) / 32 < 4 ? (K - k) / 32 : 4;
    #pragma GCC unroll 4
    for (int b = 0; b < 4; ++b) {
      if (b >= nb) {  // past K (the last step): q8lanes adds +0 there, which makes -0 +0
        #pragma GCC unroll 4
        for (int r = 0; r < R; ++r) a[r][b] = _mm512_add_ps(a[r][b], _mm512_setzero_ps());
        continue;
      }
      const int64_t g = ((k + 32 * b) >> sh) - g0;
      __m512i dot[R];
      #pragma GCC unroll 4
      for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_si512();
      #pragma GCC unroll 8
      for (int e = 0; e < 8; ++e) {
        const __m512i w = _mm512_load_si512(wv + 8 * b + e);
        #pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          int32_t q;  // round e of block b: dword 4b + e % 4 of the step's vector e / 4
          __builtin_memcpy(&q, xr + r * ldr + st * kLaneStepBytes + 64 * (e / 4) + 16 * b +
                                   4 * (e % 4), 4);
          dot[r] = _mm512_dpbusd_epi32(dot[r], w, _mm512_set1_epi32(q));
        }
      }
      #pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const float* f = xd + r * ldf + st * kLaneStepFloats + 4 * b;
        a[r][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]),
                                  _mm512_mul_ps(sv[g], _mm512_set1_ps(f[0])), a[r][b]);
        a[r][b] = _mm512_fmadd_ps(bv[g], _mm512_set1_ps(f[16]), a[r][b]);
      }
    }
  }
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    if (st1 == steps) {
      _mm512_storeu_ps(y + r * ldy, _mm512_add_ps(_mm512_add_ps(a[r][0], a[r][2]),
                                                   _mm512_add_ps(a[r][1], a[r][3])));
    } else {
      #pragma GCC unroll 4
      for (int b = 0; b < 4; ++b) acc[4 * r + b] = a[r][b];
    }
  }
}

// Rows 0..M-1 (M <= kWideMaxRows) of x against the 16 columns at w (strides ldq, ldg; b null:
// symmetric) into y (16 columns a row), K in chunks of up to kWideSteps steps.
template <int BITS, typename S>
void q8wide(const int8_t* xr, int64_t ldr, const float* xd, int64_t ldf, const uint8_t* w,
            int64_t ldq, const S* s, const S* b, int64_t ldg, float* y, int64_t ldy, int64_t M,
            int64_t K, int64_t gs) {
  alignas(64) __m512i wv[kWideSteps * 32];
  alignas(64) __m512 sv[kWideSteps * 4], bv[kWideSteps * 4];
  alignas(64) __m512 acc[kWideMaxRows * 4];  // read only where K takes more than one chunk
  const int64_t steps = (K + 127) / 128;
  // the packed rows kWideAhead blocks on, and their scales and biases
  const uint8_t* pf = ldq != 0 ? w + kWideAhead * 16 * ldq : nullptr;
  const int64_t pf_step = (16 * ldq + steps * 64 - 1) / (steps * 64) * 64;
  for (int64_t p = 0; p < 16 * ldg * int64_t(sizeof(S)); p += 64) {
    __builtin_prefetch(reinterpret_cast<const char*>(s + kWideAhead * 16 * ldg) + p, 0, 2);
    if (b != nullptr)
      __builtin_prefetch(reinterpret_cast<const char*>(b + kWideAhead * 16 * ldg) + p, 0, 2);
  }
  for (int64_t st0 = 0; st0 < steps; st0 += kWideSteps) {
    const int64_t st1 = st0 + kWideSteps < steps ? st0 + kWideSteps : steps;
    const int64_t k1 = st1 * 128 < K ? st1 * 128 : K;
    const int64_t g0 = st0 * 128 / gs, g1 = (k1 + gs - 1) / gs;
    wide_weights<BITS>(w, ldq, st0, st1, K, wv, pf, pf_step);
    wide_groups(s, ldg, g0, g1, sv);
    if (b != nullptr)
      wide_groups(b, ldg, g0, g1, bv);
    else
      for (int64_t g = 0; g < g1 - g0; ++g) bv[g] = bias_of(sv[g], BITS);
    int64_t r = 0;
    for (; r + kWideRowsPerPass <= M; r += kWideRowsPerPass)
      wide_pass<kWideRowsPerPass>(xr + r * ldr, ldr, xd + r * ldf, ldf, wv, sv, bv, g0, st0,
                                  st1, steps, K, gs, acc + 4 * r, y + r * ldy, ldy);
    const int64_t left = M - r;
    if (left == 3)
      wide_pass<3>(xr + r * ldr, ldr, xd + r * ldf, ldf, wv, sv, bv, g0, st0, st1, steps, K, gs,
                   acc + 4 * r, y + r * ldy, ldy);
    else if (left == 2)
      wide_pass<2>(xr + r * ldr, ldr, xd + r * ldf, ldf, wv, sv, bv, g0, st0, st1, steps, K, gs,
                   acc + 4 * r, y + r * ldy, ldy);
    else if (left == 1)
      wide_pass<1>(xr + r * ldr, ldr, xd + r * ldf, ldf, wv, sv, bv, g0, st0, st1, steps, K, gs,
                   acc + 4 * r, y + r * ldy, ldy);
  }
}

// Columns n0..n1-1: blocks of 16 in the wide form, the rest as q8rows takes them; rows in
// groups of up to kWideMaxRows.
template <int BITS, typename S>
void q8wide_rows(const int8_t* xr, int64_t ldr, const float* xd, const float* xs, int64_t ldf,
                 const uint8_t* wq, int64_t ldq, const S* s, const S* b, int64_t ldg, float* y,
                 int64_t ldy, int64_t M, int64_t K, int64_t gs, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 16 <= n1; n += 16)
    for (int64_t r = 0; r < M; r += kWideMaxRows)
      q8wide<BITS, S>(xr + r * ldr, ldr, xd + r * ldf, ldf, wq + n * ldq, ldq, s + n * ldg,
                      b ? b + n * ldg : nullptr, ldg, y + r * ldy + n, ldy,
                      M - r < kWideMaxRows ? M - r : kWideMaxRows, K, gs);
  if (n < n1) q8rows<BITS, S>(xr, ldr, xd, xs, ldf, wq, ldq, s, b, ldg, y, ldy, M, K, gs, n, n1);
}

template <typename S>
void q8wide_typed(int bits, const int8_t* xr, int64_t ldr, const float* xd, const float* xs,
                  int64_t ldf, const uint8_t* wq, int64_t ldq, const void* s, const void* b,
                  int64_t ldg, float* y, int64_t ldy, int64_t M, int64_t K, int64_t gs,
                  int64_t n0, int64_t n1) {
  const S *ts = static_cast<const S*>(s), *tb = static_cast<const S*>(b);
  if (bits == 8)
    return q8wide_rows<8, S>(xr, ldr, xd, xs, ldf, wq, ldq, ts, tb, ldg, y, ldy, M, K, gs, n0,
                             n1);
  q8wide_rows<4, S>(xr, ldr, xd, xs, ldf, wq, ldq, ts, tb, ldg, y, ldy, M, K, gs, n0, n1);
}

}  // namespace

void q8quantize_avx512(int bits, const float* x, int64_t ldx, int64_t M, int64_t K, int8_t* xr,
                       int64_t ldr, float* xd, float* /*xs*/, int64_t ldf) {
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
      // the lane layout: round e at dword 4 * blk + e % 4 of vector e / 4
      int8_t* step = xr + m * ldr + st * kLaneStepBytes + 16 * blk;
      for (int i = 0; i < 8; ++i) {
        const int e = bits == 4 ? kRound4[i] : i;
        __builtin_memcpy(step + 64 * (e / 4) + 4 * (e % 4), dw + i, 4);
      }
      float* f = xd + m * ldf + st * kLaneStepFloats + 4 * blk;
      for (int j = 0; j < 4; ++j) {
        f[j] = d;
        f[16 + j] = d * static_cast<float>(sum);
      }
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
  if (M >= kQ8WideRows) {
    if (half)
      return q8wide_typed<uint16_t>(bits, xr, ldr, xd, xs, ldf, wq, ldq, s, b, ldg, y, ldy, M, K,
                                    gs, n0, n1);
    return q8wide_typed<float>(bits, xr, ldr, xd, xs, ldf, wq, ldq, s, b, ldg, y, ldy, M, K, gs,
                               n0, n1);
  }
  q8rows_bits(bits, xr, ldr, xd, xs, ldf, wq, ldq, s, b, half, ldg, y, ldy, M, K, gs, n0, n1);
}

}  // namespace edgespec_native
