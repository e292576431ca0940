// The int8-activation form of kernel_q.h's product on AVX2, compiled with -mavx2 -mfma -mf16c only
// (see kernel.h for why the ISA files include nothing else): the 4 columns as two pairs, one
// after the other, with 8-lane accumulators (lane (column, block)), every (row, column, block)
// taking the float operations kernel_q8_avx512.cpp's kernels take, in their order (its lanes
// differ: (row, block) for 4 rows or more, (block, column) below): the same bits as the
// AVX-512 VNNI form. The rounds come from 16-byte loads of each block of
// the pair's columns and a 4 x 4 dword transpose per 128-bit lane.
//
// Integer dots without VNNI: vpmaddubsw (u8 x s8, pairs summed into saturating int16) then
// vpmaddwd against ones. 4 bits: every weight is <= 15 and |q| <= 127, so a pair is at most
// 3810 and the 8 rounds of a step sum to at most 30480 in int16 before one vpmaddwd: exact.
// 8 bits: the bytes split into low and high nibbles, each summed like 4 bits, then
// low + 16 * high in int32: exact.
#include <immintrin.h>

#include <cstdint>

namespace edgespec_native {
namespace {

constexpr int kMaxRows = 4;  // rows of x a weight step is unpacked for
// How many 4-column quads ahead the packed rows are prefetched (kernel_q8_avx512.cpp's kAhead).
constexpr int64_t kAhead = 8;

// 16 bytes at p into lane 0 and 16 at q into lane 1 (zeros for a null pointer).
inline __m256i load2(const uint8_t* p, const uint8_t* q) {
  const __m128i a = p ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)) : _mm_setzero_si128();
  const __m128i b = q ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)) : _mm_setzero_si128();
  return _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
}

// z[b] (lanes: the pair's two columns, dword e) transposed per 128-bit lane: t[e] lane j =
// [z[0..3] lane j dword e].
inline void transpose4(const __m256i z[4], __m256i* t) {
  const __m256i p0 = _mm256_unpacklo_epi32(z[0], z[1]), p1 = _mm256_unpackhi_epi32(z[0], z[1]);
  const __m256i p2 = _mm256_unpacklo_epi32(z[2], z[3]), p3 = _mm256_unpackhi_epi32(z[2], z[3]);
  t[0] = _mm256_unpacklo_epi64(p0, p2);
  t[1] = _mm256_unpackhi_epi64(p0, p2);
  t[2] = _mm256_unpacklo_epi64(p1, p3);
  t[3] = _mm256_unpackhi_epi64(p1, p3);
}

// The 8 round vectors of one step (values k.. k+127) of the column pair at w (row stride ldq),
// lane (j, b) as on AVX-512; 8 bits: lo / hi the low and high nibbles (4 bits: lo only).
template <int BITS>
inline void rounds(const uint8_t* w, int64_t ldq, int64_t k, int64_t K, __m256i lo[8],
                   __m256i hi[8]) {
  const int64_t nb = (K - k) / 32 < 4 ? (K - k) / 32 : 4;  // blocks of the step before K
  const __m256i m4 = _mm256_set1_epi8(15);
  constexpr int kBytes = BITS * 4;  // a block's bytes
  __m256i t[8];
  for (int half = 0; half < kBytes / 16; ++half) {  // 16 bytes of every block at a time
    __m256i z[4];
    for (int b = 0; b < 4; ++b) {
      const int64_t at = k * BITS / 8 + b * kBytes + 16 * half;
      z[b] = b < nb ? load2(w + at, w + ldq + at) : _mm256_setzero_si256();
    }
    transpose4(z, t + 4 * half);
  }
  if constexpr (BITS == 4) {
    for (int e = 0; e < 4; ++e) {
      lo[e] = _mm256_and_si256(t[e], m4);
      lo[4 + e] = _mm256_and_si256(_mm256_srli_epi16(t[e], 4), m4);
    }
  } else {
    for (int e = 0; e < 8; ++e) {
      lo[e] = _mm256_and_si256(t[e], m4);
      hi[e] = _mm256_and_si256(_mm256_srli_epi16(t[e], 4), m4);
    }
  }
}

// v[0 .. n - 1] and w[0 .. n - 1] (n <= 4) in lanes 0 and 1, the rest 0: float32 scales or
// biases, or float16 ones (their bits as uint16_t), widened exactly (F16C, one conversion).
inline __m256 pair(const float* v, const float* w, int n) {
  const __m128i m = _mm_cmpgt_epi32(_mm_set1_epi32(n), _mm_setr_epi32(0, 1, 2, 3));
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_maskload_ps(v, m)),
                              _mm_maskload_ps(w, m), 1);
}

inline long long four_halves(const uint16_t* v, int n) {
  long long bits = 0;
  if (n == 4) {
    __builtin_memcpy(&bits, v, 8);  // a whole step's: one load (a variable length is a call)
  } else {
    for (int i = 0; i < n; ++i) bits |= static_cast<long long>(v[i]) << (16 * i);
  }
  return bits;
}

inline __m256 pair(const uint16_t* v, const uint16_t* w, int n) {
  return _mm256_cvtph_ps(_mm_set_epi64x(four_halves(w, n), four_halves(v, n)));
}

// Lane (j, b) = v[j * ldg + group of block b] for the pair's columns (0 past K).
template <typename S>
inline __m256 per_lane(const S* v, int64_t ldg, int64_t k, int64_t K, int64_t gs) {
  const int sh = gs == 32 ? 5 : gs == 64 ? 6 : 7;  // gs is 32, 64 or 128: shifts, not divisions
  const int64_t g0 = k >> sh, gpc = 128 >> sh, left = (K - k + gs - 1) >> sh;
  const int n = int(left < gpc ? left : gpc);
  const __m256 c = pair(v + g0, v + ldg + g0, n);
  if (gs == 64) return _mm256_permute_ps(c, _MM_SHUFFLE(1, 1, 0, 0));  // block b's group: b / 2
  if (gs == 128) return _mm256_permute_ps(c, 0);
  return c;
}

inline __m256i bcast16(const int8_t* p) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m256 bcast4(const float* p) { return _mm256_broadcast_ps(reinterpret_cast<const __m128*>(p)); }

template <int BITS>
inline __m256i dot(const __m256i lo[8], const __m256i hi[8], const int8_t* x) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i p = _mm256_maddubs_epi16(lo[0], bcast16(x));
  for (int e = 1; e < 8; ++e) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(lo[e], bcast16(x + 16 * e)));
  if constexpr (BITS == 4) {
    return _mm256_madd_epi16(p, ones);
  } else {
    __m256i q = _mm256_maddubs_epi16(hi[0], bcast16(x));
    for (int e = 1; e < 8; ++e) q = _mm256_add_epi16(q, _mm256_maddubs_epi16(hi[e], bcast16(x + 16 * e)));
    return _mm256_add_epi32(_mm256_madd_epi16(p, ones), _mm256_madd_epi16(q, _mm256_set1_epi16(16)));
  }
}

template <int BITS, int MB, typename S>
inline void q8block(const int8_t* xr, int64_t ldr, const float* xd, const float* xs, int64_t ldf,
                    const uint8_t* wq, int64_t ldq, const S* s, const S* b, int64_t ldg,
                    float* y, int64_t ldy, int64_t K, int64_t gs, int nc, const uint8_t* pf,
                    int64_t pf_step) {
  alignas(32) float out[MB][8];
  for (int p = 0; p < 2; ++p) {  // columns 2p, 2p + 1
    __m256 acc[MB];
    for (int i = 0; i < MB; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t k = 0, st = 0; k < K; k += 128, ++st) {
      if (pf != nullptr)  // this step's share of the packed rows kAhead quads on (2 per pair)
        for (int64_t q = (2 * st + p) * pf_step; q < (2 * st + p + 1) * pf_step; q += 64)
          __builtin_prefetch(pf + q, 0, 2);
      __m256i lo[8], hi[8];
      rounds<BITS>(wq + 2 * p * ldq, ldq, k, K, lo, hi);
      const __m256 sv = per_lane(s + 2 * p * ldg, ldg, k, K, gs);
      const __m256 bv = per_lane(b + 2 * p * ldg, ldg, k, K, gs);
      for (int i = 0; i < MB; ++i) {
        const __m256i d = dot<BITS>(lo, hi, xr + i * ldr + st * 128);
        const int64_t f = i * ldf + st * 4;
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(sv, bcast4(xd + f)), acc[i]);
        acc[i] = _mm256_fmadd_ps(bv, bcast4(xs + f), acc[i]);
      }
    }
    for (int i = 0; i < MB; ++i) {  // per column: (b0 + b2) + (b1 + b3)
      const __m256 t = _mm256_add_ps(acc[i], _mm256_permute_ps(acc[i], _MM_SHUFFLE(1, 0, 3, 2)));
      _mm256_store_ps(out[i], _mm256_add_ps(t, _mm256_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1))));
      for (int j = 2 * p; j < nc && j < 2 * p + 2; ++j) y[i * ldy + j] = out[i][4 * (j - 2 * p)];
    }
  }
}

template <int BITS, typename S>
void q8columns(const int8_t* xr, int64_t ldr, const float* xd, const float* xs, int64_t ldf,
               const uint8_t* w, int64_t ldq, const S* s, const S* b, int64_t ldg,
               float* y, int64_t ldy, int64_t M, int64_t K, int64_t gs, int nc) {
  // The first row block asks for the 4 packed rows kAhead quads on (contiguous: 4 ldq bytes),
  // spread over its steps, as the VNNI form does (q8rows asks for their scales and biases).
  const uint8_t* pf = ldq != 0 ? w + kAhead * 4 * ldq : nullptr;
  const int64_t steps = (K + 127) / 128;
  const int64_t pf_step = (4 * ldq + 2 * steps * 64 - 1) / (2 * steps * 64) * 64;
#define Q8ROWS(MB, m)                                                                      \
  q8block<BITS, MB, S>(xr + (m) * ldr, ldr, xd + (m) * ldf, xs + (m) * ldf, ldf, w, ldq, s, b, \
                       ldg, y + (m) * ldy, ldy, K, gs, nc, (m) == 0 ? pf : nullptr, pf_step)
  int64_t m = 0;
  for (; m + kMaxRows <= M; m += kMaxRows) Q8ROWS(kMaxRows, m);
  switch (M - m) {
    case 3: Q8ROWS(3, m); break;
    case 2: Q8ROWS(2, m); break;
    case 1: Q8ROWS(1, m); break;
    default: break;
  }
#undef Q8ROWS
}

#include "q8_rows.inc"

}  // namespace

void q8rows_avx2(int bits, const int8_t* xr, int64_t ldr, const float* xd, const float* xs,
                 int64_t ldf, const uint8_t* wq, int64_t ldq, const void* s, const void* b,
                 bool half, int64_t ldg, float* y, int64_t ldy, int64_t M, int64_t K, int64_t gs,
                 int64_t n0, int64_t n1) {
  q8rows_bits(bits, xr, ldr, xd, xs, ldf, wq, ldq, s, b, half, ldg, y, ldy, M, K, gs, n0, n1);
}

}  // namespace edgespec_native
