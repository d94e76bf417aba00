// Row primitives of the paged-attention kernel: K/V rows of cache blocks as float32 (converted from
// float16, bfloat16 or scaled int8 as they are read), dot products of a query with them, and the P.V
// accumulation. AVX-512, AVX2 or portable, whichever the compiler targets.
#ifndef MS_ATB_OPS_ATTENTION_ROWS_H_
#define MS_ATB_OPS_ATTENTION_ROWS_H_

#include <cstdint>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "attention_decode.h"
#include "dtype.h"

namespace ms_atb {

// dst[:D] = float32 of one cache row; an int8 row is multiplied by its scale (value = q * scale), a float
// row ignores `scale`. The conversion runs as the row is read, a vector at a time with the decode path's
// loads (attention_decode.h: AVX-512 or AVX2), the rest element by element.
template <typename C>
inline float RowValue(C x, float) { return ToFloat(x); }
inline float RowValue(int8_t x, float scale) { return static_cast<float>(x) * scale; }

template <typename C>
inline void RowToFloat(const C *src, float scale, int64_t D, float *dst) {
  int64_t d = 0;
#if defined(MS_ATB_DECODE_IN_REGISTERS)
  for (; d + decode::kLanes <= D; d += decode::kLanes) decode::StoreF(dst + d, decode::Load(src + d, scale));
#endif
  for (; d < D; ++d) dst[d] = RowValue(src[d], scale);
}

// The n cache rows src[t * stride : t * stride + D] as float32 rows of stride *out_stride: read in place
// when they are float32, else converted into buf. scales: one per row, scales[t * scale_stride] (int8
// caches), or null.
template <typename C>
inline const float *Rows(const C *src, const float *scales, int64_t scale_stride, int64_t n, int64_t stride,
                         int64_t D, std::vector<float> &buf, int64_t *out_stride) {
  if (buf.size() < static_cast<size_t>(n * D)) buf.resize(n * D);
  for (int64_t t = 0; t < n; ++t)
    RowToFloat(src + t * stride, scales ? scales[t * scale_stride] : 1.0f, D, buf.data() + t * D);
  *out_stride = D;
  return buf.data();
}

inline const float *Rows(const float *src, const float *, int64_t, int64_t, int64_t stride, int64_t,
                         std::vector<float> &, int64_t *out_stride) {
  *out_stride = stride;
  return src;
}


// out[t] = dot(q, k[t * ks : t * ks + D]) for t < n.
inline void DotRows(const float *q, const float *k, int64_t ks, int64_t n, int64_t D, float *out) {
  int64_t t = 0;
#if defined(__AVX512F__)
  if (D % 16 == 0) {
    for (; t + 4 <= n; t += 4) {  // four tokens at once, 16 lanes per FMA
      const float *k0 = k + t * ks, *k1 = k0 + ks, *k2 = k1 + ks, *k3 = k2 + ks;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t d = 0; d < D; d += 16) {
        const __m512 qv = _mm512_loadu_ps(q + d);
        a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + d), a0);
        a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k1 + d), a1);
        a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k2 + d), a2);
        a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k3 + d), a3);
      }
      out[t] = _mm512_reduce_add_ps(a0);
      out[t + 1] = _mm512_reduce_add_ps(a1);
      out[t + 2] = _mm512_reduce_add_ps(a2);
      out[t + 3] = _mm512_reduce_add_ps(a3);
    }
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if (D % 8 == 0) {
    for (; t + 4 <= n; t += 4) {  // four tokens at once: independent FMA chains, one reduction
      const float *k0 = k + t * ks, *k1 = k0 + ks, *k2 = k1 + ks, *k3 = k2 + ks;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
      }
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
      _mm_storeu_ps(out + t, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    }
  }
#endif
  for (; t < n; ++t) {
    const float *kt = k + t * ks;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < D; ++d) dot += q[d] * kt[d];
    out[t] = dot;
  }
}

// acc[:D] += sum over t < n of p[t] * v[t * vs : t * vs + D].
inline void AccumulateRows(const float *p, const float *v, int64_t vs, int64_t n, int64_t D, float *acc) {
  int64_t d = 0;
#if defined(__AVX512F__)
  for (; d + 64 <= D; d += 64) {  // 64 columns held in four zmm registers across the tokens
    __m512 c0 = _mm512_loadu_ps(acc + d), c1 = _mm512_loadu_ps(acc + d + 16);
    __m512 c2 = _mm512_loadu_ps(acc + d + 32), c3 = _mm512_loadu_ps(acc + d + 48);
    for (int64_t t = 0; t < n; ++t) {
      const __m512 pv = _mm512_set1_ps(p[t]);
      const float *vt = v + t * vs + d;
      c0 = _mm512_fmadd_ps(pv, _mm512_loadu_ps(vt), c0);
      c1 = _mm512_fmadd_ps(pv, _mm512_loadu_ps(vt + 16), c1);
      c2 = _mm512_fmadd_ps(pv, _mm512_loadu_ps(vt + 32), c2);
      c3 = _mm512_fmadd_ps(pv, _mm512_loadu_ps(vt + 48), c3);
    }
    _mm512_storeu_ps(acc + d, c0);
    _mm512_storeu_ps(acc + d + 16, c1);
    _mm512_storeu_ps(acc + d + 32, c2);
    _mm512_storeu_ps(acc + d + 48, c3);
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  for (; d + 32 <= D; d += 32) {  // 32 columns held in registers across the tokens
    __m256 c0 = _mm256_loadu_ps(acc + d), c1 = _mm256_loadu_ps(acc + d + 8);
    __m256 c2 = _mm256_loadu_ps(acc + d + 16), c3 = _mm256_loadu_ps(acc + d + 24);
    for (int64_t t = 0; t < n; ++t) {
      const __m256 pv = _mm256_set1_ps(p[t]);
      const float *vt = v + t * vs + d;
      c0 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vt), c0);
      c1 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vt + 8), c1);
      c2 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vt + 16), c2);
      c3 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vt + 24), c3);
    }
    _mm256_storeu_ps(acc + d, c0);
    _mm256_storeu_ps(acc + d + 8, c1);
    _mm256_storeu_ps(acc + d + 16, c2);
    _mm256_storeu_ps(acc + d + 24, c3);
  }
#endif
  for (int64_t t = 0; t < n; ++t) {
    const float pt = p[t];
    const float *vt = v + t * vs;
#pragma omp simd
    for (int64_t e = d; e < D; ++e) acc[e] += pt * vt[e];
  }
}

}  // namespace ms_atb

#endif  // MS_ATB_OPS_ATTENTION_ROWS_H_
