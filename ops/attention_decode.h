// A decode row's pass over one cache block in AVX-512 registers: the G query rows that share a kv head score the
// block's tokens 16 at a time, read straight from the cache rows (converted as they load), their 16 dot products
// summed into one vector by a transposed reduction, and the block's softmax and P.V done on vectors. The general
// row path (attention_rows.h) converts each row into a scratch buffer first and sums each dot product alone: for
// one query row, those stores and per-token sums would be most of the work (M's shape at 512 tokens: 1.9x slower).
#ifndef MS_ATB_OPS_ATTENTION_DECODE_H_
#define MS_ATB_OPS_ATTENTION_DECODE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>

#include "dtype.h"
#include "fast_math.h"

namespace ms_atb {

// 16 cache elements as float32; an int8 row times its scale.
inline __m512 Load16(const float *src, float) { return _mm512_loadu_ps(src); }
inline __m512 Load16(const Half *src, float) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(src)));
}
inline __m512 Load16(const BFloat16 *src, float) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(src)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline __m512 Load16(const int8_t *src, float scale) {
  const __m512i w = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(src)));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(w), _mm512_set1_ps(scale));
}

// Lane t of the result = the sum of v[t]'s 16 lanes.
inline __m512 TransposedSum(__m512 v[16]) {
  __m512 a[8], b[4], c[2];
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

// exp(x) for x <= 0, lane by lane: the polynomial of ExpNonPositive (fast_math.h).
inline __m512 ExpNonPositive16(__m512 in) {
  const __m512 x = _mm512_max_ps(in, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 r =
      _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __mmask16 under = _mm512_cmp_ps_mask(in, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~under), y, _mm512_castsi512_ps(e));
}

// The G rows of one kv head (q: G rows of D floats, scaled; D a multiple of 16) over the block's first n <= 16
// tokens (k, v: their first rows, `stride` elements apart; scales: one per row, `scale_stride` apart, or null):
// the online softmax's max m[h], sum l[h] and weighted values acc[h * D, (h + 1) * D) updated in place.
template <typename C>
inline void DecodeBlock(const float *q, int64_t G, int64_t D, const C *k, const float *k_scales, const C *v,
                        const float *v_scales, int64_t stride, int64_t scale_stride, int64_t n, float *m, float *l,
                        float *acc) {
  const __mmask16 valid = static_cast<__mmask16>((1u << n) - 1);
  alignas(64) float p[16];
  float ks[16], vs[16];
  for (int64_t t = 0; t < n; ++t) {
    ks[t] = k_scales ? k_scales[t * scale_stride] : 1.0f;
    vs[t] = v_scales ? v_scales[t * scale_stride] : 1.0f;
  }
  for (int64_t h = 0; h < G; ++h) {
    const float *qh = q + h * D;
    __m512 part[16];
    for (int64_t t = 0; t < 16; ++t) {
      part[t] = _mm512_setzero_ps();
      if (t >= n) continue;
      for (int64_t d = 0; d < D; d += 16)
        part[t] = _mm512_fmadd_ps(_mm512_loadu_ps(qh + d), Load16(k + t * stride + d, ks[t]), part[t]);
    }
    const __m512 s = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY), TransposedSum(part));
    const float mx = std::max(m[h], _mm512_reduce_max_ps(s));
    float *ah = acc + h * D;
    if (mx > m[h]) {
      const float alpha = ExpNonPositive(m[h] - mx);
      l[h] *= alpha;
      for (int64_t d = 0; d < D; d += 16)
        _mm512_storeu_ps(ah + d, _mm512_mul_ps(_mm512_loadu_ps(ah + d), _mm512_set1_ps(alpha)));
      m[h] = mx;
    }
    const __m512 e = _mm512_maskz_mov_ps(valid, ExpNonPositive16(_mm512_sub_ps(s, _mm512_set1_ps(mx))));
    l[h] += _mm512_reduce_add_ps(e);
    _mm512_store_ps(p, e);
    for (int64_t d = 0; d < D; d += 16) {
      __m512 a = _mm512_loadu_ps(ah + d);
      for (int64_t t = 0; t < n; ++t) a = _mm512_fmadd_ps(_mm512_set1_ps(p[t]), Load16(v + t * stride + d, vs[t]), a);
      _mm512_storeu_ps(ah + d, a);
    }
  }
}

}  // namespace ms_atb

#endif  // __AVX512F__
#endif  // MS_ATB_OPS_ATTENTION_DECODE_H_
