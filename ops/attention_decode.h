// A decode row's pass over one cache block in vector registers (AVX-512: 16 lanes, AVX2: 8): the G query rows
// that share a kv head score the block's tokens a vector's lanes at a time, read straight from the cache rows
// (converted as they load), the dot products of those tokens summed into one vector by a transposed reduction,
// and the block's softmax and P.V done on vectors. The general row path (attention_rows.h) converts each row into
// a scratch buffer first and sums each dot product alone: for one query row, those stores and per-token sums
// would be most of the work (M's shape at 512 tokens: 1.9x slower on AVX-512).
#ifndef MS_ATB_OPS_ATTENTION_DECODE_H_
#define MS_ATB_OPS_ATTENTION_DECODE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#define MS_ATB_DECODE_IN_REGISTERS 1
#include <immintrin.h>

#include "dtype.h"
#include "fast_math.h"

namespace ms_atb {
namespace decode {

#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
using F = __m512;
inline F Zero() { return _mm512_setzero_ps(); }
inline F Set1(float a) { return _mm512_set1_ps(a); }
inline F LoadF(const float *p) { return _mm512_loadu_ps(p); }
inline void StoreF(float *p, F a) { _mm512_storeu_ps(p, a); }
inline F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
inline F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
inline F Add(F a, F b) { return _mm512_add_ps(a, b); }
inline F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
inline F Max(F a, F b) { return _mm512_max_ps(a, b); }
inline float ReduceMax(F a) { return _mm512_reduce_max_ps(a); }
inline float ReduceAdd(F a) { return _mm512_reduce_add_ps(a); }
// Lanes [0, n) of a, the others `fill`.
inline F Head(F a, int64_t n, float fill) {
  return _mm512_mask_blend_ps(static_cast<__mmask16>((1u << n) - 1), _mm512_set1_ps(fill), a);
}
// kLanes cache elements as float32; an int8 row times its scale.
inline F Load(const float *src, float) { return _mm512_loadu_ps(src); }
inline F Load(const Half *src, float) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(src)));
}
inline F Load(const BFloat16 *src, float) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(src)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline F Load(const int8_t *src, float scale) {
  const __m512i w = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(src)));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(w), _mm512_set1_ps(scale));
}

// Lane t of the result = the sum of v[t]'s 16 lanes.
inline F TransposedSum(F v[16]) {
  F a[8], b[4], c[2];
  // Each level halves the vectors and doubles the share of each 128-bit lane a vector's sum covers: (x0 + x2,
  // y0 + y2, x1 + x3, y1 + y3) of x = v[2i], y = v[2i + 1] per lane; then four vectors' lane sums side by side;
  // then two 128-bit lanes, then all four.
  for (int i = 0; i < 8; ++i)
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
    b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  for (int i = 0; i < 2; ++i)
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
}

inline F Floor(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
inline F Pow2(F n) {  // 2^n for integral n in [-126, 127]
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
inline F ZeroBelow(F in, float bound, F y) {  // y, or 0 where in < bound
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~_mm512_cmp_ps_mask(in, _mm512_set1_ps(bound), _CMP_LT_OQ)), y);
}
#else
constexpr int64_t kLanes = 8;
using F = __m256;
inline F Zero() { return _mm256_setzero_ps(); }
inline F Set1(float a) { return _mm256_set1_ps(a); }
inline F LoadF(const float *p) { return _mm256_loadu_ps(p); }
inline void StoreF(float *p, F a) { _mm256_storeu_ps(p, a); }
inline F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
inline F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
inline F Add(F a, F b) { return _mm256_add_ps(a, b); }
inline F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
inline F Max(F a, F b) { return _mm256_max_ps(a, b); }
inline float ReduceMax(F a) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}
inline float ReduceAdd(F a) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}
inline F Head(F a, int64_t n, float fill) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lanes));
  return _mm256_blendv_ps(_mm256_set1_ps(fill), a, keep);
}
inline F Load(const float *src, float) { return _mm256_loadu_ps(src); }
inline F Load(const Half *src, float) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(src)));
}
inline F Load(const BFloat16 *src, float) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(src)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline F Load(const int8_t *src, float scale) {
  const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(src)));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(w), _mm256_set1_ps(scale));
}

// Lane t of the result = the sum of v[t]'s 8 lanes: as the AVX-512 one, with one 128-bit level fewer.
inline F TransposedSum(F v[8]) {
  F a[4], b[2];
  for (int i = 0; i < 4; ++i)
    a[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 2; ++i) {
    const __m256d x = _mm256_castps_pd(a[2 * i]), y = _mm256_castps_pd(a[2 * i + 1]);
    b[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)), _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20), _mm256_permute2f128_ps(b[0], b[1], 0x31));
}

inline F Floor(F a) { return _mm256_floor_ps(a); }
inline F Pow2(F n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline F ZeroBelow(F in, float bound, F y) {
  return _mm256_andnot_ps(_mm256_cmp_ps(in, _mm256_set1_ps(bound), _CMP_LT_OQ), y);
}
#endif

// exp(x) for x <= 0, lane by lane: the polynomial of ExpNonPositive (fast_math.h).
inline F ExpNonPositive(F in) {
  const F x = Max(in, Set1(-87.0f));
  const F n = Floor(Fma(x, Set1(1.44269504f), Set1(0.5f)));
  const F r = Fma(n, Set1(2.12194440e-4f), Fma(n, Set1(-0.693359375f), x));
  F p = Set1(1.9875691500e-4f);
  p = Fma(p, r, Set1(1.3981999507e-3f));
  p = Fma(p, r, Set1(8.3334519073e-3f));
  p = Fma(p, r, Set1(4.1665795894e-2f));
  p = Fma(p, r, Set1(1.6666665459e-1f));
  p = Fma(p, r, Set1(5.0000001201e-1f));
  const F y = Add(Fma(Mul(p, r), r, r), Set1(1.0f));
  return ZeroBelow(in, -87.0f, Mul(y, Pow2(n)));
}

// The most tokens DecodeBlock takes at once: a cache block's share of them.
constexpr int64_t kDecodeTokens = 16;
constexpr int64_t kDecodeChunks = kDecodeTokens / kLanes;

}  // namespace decode

namespace decode {

// Accumulators a pass keeps in registers: HG heads times 8 / HG tokens (scores) or vectors of columns (P.V), so
// that each K or V vector is loaded, and converted, once for the HG heads that read it.
constexpr int kAccumulators = 8;

// s[h][c] = the scores of heads [0, HG) (q: HG rows of D floats, scaled) for tokens [c L, (c + 1) L) of the block's
// first n (k: their rows, `stride` elements apart; ks: each row's scale), -inf past n.
template <int HG, typename C>
inline void Scores(const float *q, int64_t D, const C *k, const float *ks, int64_t stride, int64_t n,
                   F s[HG][kDecodeChunks]) {
  constexpr int64_t L = kLanes, TK = kAccumulators / HG;
  for (int64_t c = 0; c < kDecodeChunks; ++c) {
    const int64_t nc = std::max<int64_t>(0, std::min(n - c * L, L));  // valid tokens of this chunk
    F part[HG][L];
    for (int64_t t0 = 0; t0 < L; t0 += TK) {
      // Each token's sum runs over d in order, a full pass's loop with a fixed count so that its sums stay in
      // registers; the tokens past nc are not read.
      F a[HG][TK];
      for (int h = 0; h < HG; ++h)
        for (int64_t i = 0; i < TK; ++i) a[h][i] = Zero();
      const C *kt = k + (c * L + t0) * stride;
      const float *kst = ks + c * L + t0;
      if (t0 + TK <= nc) {
        for (int64_t d = 0; d < D; d += L) {
          F kv[TK];
          for (int64_t i = 0; i < TK; ++i) kv[i] = Load(kt + i * stride + d, kst[i]);
          for (int h = 0; h < HG; ++h) {
            const F qd = LoadF(q + h * D + d);
            for (int64_t i = 0; i < TK; ++i) a[h][i] = Fma(qd, kv[i], a[h][i]);
          }
        }
      } else {
        for (int64_t d = 0; d < D; d += L)
          for (int64_t i = 0; i < nc - t0; ++i) {
            const F kv = Load(kt + i * stride + d, kst[i]);
            for (int h = 0; h < HG; ++h) a[h][i] = Fma(LoadF(q + h * D + d), kv, a[h][i]);
          }
      }
      for (int h = 0; h < HG; ++h)
        for (int64_t i = 0; i < TK; ++i) part[h][t0 + i] = a[h][i];
    }
    for (int h = 0; h < HG; ++h) s[h][c] = Head(TransposedSum(part[h]), nc, -INFINITY);
  }
}

// acc[h * D, (h + 1) * D) += p[h][t] v[t] for heads [0, HG), t < n in order (v: rows `stride` elements apart; vs:
// each row's scale).
template <int HG, typename C>
inline void AccumulateValues(const float (*p)[kDecodeTokens], const C *v, const float *vs, int64_t stride,
                             int64_t n, int64_t D, float *acc) {
  constexpr int64_t L = kLanes, VC = kAccumulators / HG;
  int64_t d = 0;
  for (; d + VC * L <= D; d += VC * L) {
    F a[HG][VC];
    for (int h = 0; h < HG; ++h)
      for (int64_t j = 0; j < VC; ++j) a[h][j] = LoadF(acc + h * D + d + j * L);
    for (int64_t t = 0; t < n; ++t) {
      F vv[VC];
      for (int64_t j = 0; j < VC; ++j) vv[j] = Load(v + t * stride + d + j * L, vs[t]);
      for (int h = 0; h < HG; ++h) {
        const F pt = Set1(p[h][t]);
        for (int64_t j = 0; j < VC; ++j) a[h][j] = Fma(pt, vv[j], a[h][j]);
      }
    }
    for (int h = 0; h < HG; ++h)
      for (int64_t j = 0; j < VC; ++j) StoreF(acc + h * D + d + j * L, a[h][j]);
  }
  for (; d < D; d += L) {
    F a[HG];
    for (int h = 0; h < HG; ++h) a[h] = LoadF(acc + h * D + d);
    for (int64_t t = 0; t < n; ++t) {
      const F vv = Load(v + t * stride + d, vs[t]);
      for (int h = 0; h < HG; ++h) a[h] = Fma(Set1(p[h][t]), vv, a[h]);
    }
    for (int h = 0; h < HG; ++h) StoreF(acc + h * D + d, a[h]);
  }
}

// Heads [0, HG) of DecodeBlock: scores, the online softmax's update, P.V.
template <int HG, typename C>
inline void DecodeHeads(const float *q, int64_t D, const C *k, const float *ks, const C *v, const float *vs,
                        int64_t stride, int64_t n, float *m, float *l, float *acc) {
  constexpr int64_t L = kLanes;
  F s[HG][kDecodeChunks];
  Scores<HG>(q, D, k, ks, stride, n, s);
  alignas(64) float p[HG][kDecodeTokens];
  for (int h = 0; h < HG; ++h) {
    F mv = s[h][0];
    for (int64_t c = 1; c < kDecodeChunks; ++c) mv = Max(mv, s[h][c]);
    const float mx = std::max(m[h], ReduceMax(mv));
    float *ah = acc + h * D;
    if (mx > m[h]) {
      const float alpha = ms_atb::ExpNonPositive(m[h] - mx);
      l[h] *= alpha;
      for (int64_t d = 0; d < D; d += L) StoreF(ah + d, Mul(LoadF(ah + d), Set1(alpha)));
      m[h] = mx;
    }
    F sum = Zero();
    for (int64_t c = 0; c < kDecodeChunks; ++c) {
      // exp(-inf - mx) is 0: the lanes past n add nothing.
      const F e = ExpNonPositive(Sub(s[h][c], Set1(mx)));
      sum = Add(sum, e);
      StoreF(p[h] + c * L, e);
    }
    l[h] += ReduceAdd(sum);
  }
  AccumulateValues<HG>(p, v, vs, stride, n, D, acc);
}

}  // namespace decode

// The G rows of one kv head (q: G rows of D floats, scaled; D a multiple of decode::kLanes) over the block's first
// n <= kDecodeTokens tokens (k, v: their first rows, `stride` elements apart; scales: one per row, `scale_stride`
// apart, or null): the online softmax's max m[h], sum l[h] and weighted values acc[h * D, (h + 1) * D) updated in
// place. Heads go four, two or one at a time, each K and V vector loaded, and converted, once for the heads of a
// group (M's shape: 4 query heads a kv head, a float16 cache of 512 tokens in L3, 2 threads: 75-78 us a call with
// a conversion a head, 68-71 grouped). Each value's sums run in the same order whatever the grouping, so the
// results are those of one head at a time, bit for bit.
template <typename C>
inline void DecodeBlock(const float *q, int64_t G, int64_t D, const C *k, const float *k_scales, const C *v,
                        const float *v_scales, int64_t stride, int64_t scale_stride, int64_t n, float *m, float *l,
                        float *acc) {
  float ks[decode::kDecodeTokens], vs[decode::kDecodeTokens];
  for (int64_t t = 0; t < n; ++t) {
    ks[t] = k_scales ? k_scales[t * scale_stride] : 1.0f;
    vs[t] = v_scales ? v_scales[t * scale_stride] : 1.0f;
  }
  for (int64_t h = 0; h < G;) {
    const int64_t left = G - h;
    if (left >= 4) {
      decode::DecodeHeads<4>(q + h * D, D, k, ks, v, vs, stride, n, m + h, l + h, acc + h * D);
      h += 4;
    } else if (left >= 2) {
      decode::DecodeHeads<2>(q + h * D, D, k, ks, v, vs, stride, n, m + h, l + h, acc + h * D);
      h += 2;
    } else {
      decode::DecodeHeads<1>(q + h * D, D, k, ks, v, vs, stride, n, m + h, l + h, acc + h * D);
      h += 1;
    }
  }
}

}  // namespace ms_atb

#endif  // MS_ATB_DECODE_IN_REGISTERS
#endif  // MS_ATB_OPS_ATTENTION_DECODE_H_
