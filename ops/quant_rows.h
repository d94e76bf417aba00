// x's rows quantized for the int8-activation product (quant_dot.h): per row and block of 32 k,
//   d_x = max |x| / 127, q_x = round(x / d_x) (float32 division, nearest even; d_x = 0: q_x = 0),
//   s_x = sum of q_x over the block.
#ifndef MS_ATB_OPS_QUANT_ROWS_H_
#define MS_ATB_OPS_QUANT_ROWS_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "quant_layout.h"

namespace ms_atb {
namespace dot {

// The quantized rows of x: q [rows][kq] (kq = ceil(K / 32) 32, zero past K), d and s [rows][kq / 32].
struct QuantRows {
  const int8_t *q;
  const float *d;
  const int32_t *s;
  int64_t kq;
};

// One row of x [K] into q [kq], d and s [kq / 32]. AVX-512: a block is two registers (zero past K), with the
// plain loops' arithmetic (a NaN is passed over by the maximum, as there); elsewhere plain loops the compiler
// vectorises (no libm calls).
inline void QuantizeRow(const float *x, int64_t K, int8_t *q, float *d, int32_t *s) {
#if defined(__AVX512F__)
  const __m512 limit = _mm512_set1_ps(127.0f), nlimit = _mm512_set1_ps(-127.0f);
  for (int64_t k0 = 0, b = 0; k0 < K; k0 += kQuantBlock, ++b) {
    const int64_t n = K - k0 < kQuantBlock ? K - k0 : kQuantBlock;
    const __mmask16 m0 = n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
    const __mmask16 m1 = n >= 32 ? 0xFFFF : n <= 16 ? 0 : static_cast<__mmask16>((1u << (n - 16)) - 1);
    const __m512 a = _mm512_maskz_loadu_ps(m0, x + k0), c = _mm512_maskz_loadu_ps(m1, x + k0 + 16);
    __m512 amax = _mm512_max_ps(_mm512_abs_ps(a), _mm512_setzero_ps());  // max(v, amax): a NaN v keeps amax
    amax = _mm512_max_ps(_mm512_abs_ps(c), amax);
    const float db = _mm512_reduce_max_ps(amax) / 127.0f;
    const __m512 div = _mm512_set1_ps(db > 0.0f ? db : 1.0f);
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512 ra = _mm512_roundscale_ps(_mm512_div_ps(a, div), kNearest);
    const __m512 rc = _mm512_roundscale_ps(_mm512_div_ps(c, div), kNearest);
    const __m512 qa = _mm512_min_ps(_mm512_max_ps(ra, nlimit), limit);
    const __m512 qc = _mm512_min_ps(_mm512_max_ps(rc, nlimit), limit);
    const __m512i ia = _mm512_cvttps_epi32(qa), ic = _mm512_cvttps_epi32(qc);
    _mm_storeu_si128(reinterpret_cast<__m128i *>(q + k0), _mm512_cvtepi32_epi8(ia));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(q + k0 + 16), _mm512_cvtepi32_epi8(ic));
    d[b] = db;
    s[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(ia, ic));
  }
#else
  for (int64_t k0 = 0, b = 0; k0 < K; k0 += kQuantBlock, ++b) {
    const int64_t n = K - k0 < kQuantBlock ? K - k0 : kQuantBlock;
    float xb[kQuantBlock] = {};  // the block, zero past K
    std::memcpy(xb, x + k0, sizeof(float) * n);
    float amax = 0.0f;
#pragma omp simd reduction(max : amax)
    for (int k = 0; k < kQuantBlock; ++k) {
      const float a = xb[k] < 0.0f ? -xb[k] : xb[k];
      amax = a > amax ? a : amax;
    }
    const float db = amax / 127.0f;
    const float div = db > 0.0f ? db : 1.0f;  // d_x = 0: every x is 0 and so is every q
    int32_t sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int k = 0; k < kQuantBlock; ++k) {
      float v = std::nearbyint(xb[k] / div);
      v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;  // |x| / d_x rounds to at most 127
      q[k0 + k] = static_cast<int8_t>(v);
      sum += static_cast<int32_t>(v);
    }
    d[b] = db;
    s[b] = sum;
  }
#endif
}

}  // namespace dot
}  // namespace ms_atb

#endif  // MS_ATB_OPS_QUANT_ROWS_H_
