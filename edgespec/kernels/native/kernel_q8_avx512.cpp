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
  q8rows_bits(bits, xr, ldr, xd, xs, ldf, wq, ldq, s, b, half, ldg, y, ldy, M, K, gs, n0, n1);
}

}  // namespace edgespec_native
