// The small-batch path of QuantMatMul (ops/quant_matmul.cc): y[0:M, panels] = x[0:M, 0:K] @ W for a few rows
// of x, each weight dequantised in registers and multiplied there, never stored as float32. For a few rows the
// tile path's dequantise-into-L1-then-multiply costs a store and a reload per weight for a few multiply-adds,
// and its narrow tiles leave the FMA latency exposed; here a weight costs its load, its conversion and the
// multiply-adds, for up to 4 rows at a time (more rows: the panels again, from L1, per 4 rows).
//   x [M, K] float32 (rows K apart); panels: the panels of quant_matmul.cc's layout, panel_bytes apart;
//   y [M, ldy] float32, panel i's columns at y + 16 i.
// Numerics: each output column is one chain acc = x[k] * w[k] + acc, k = 0..K-1 from acc = 0, fused where
// the tile fuses it (AVX2/FMA, AVX-512) and not where it does not (portable), over the same dequantised
// values w: the results equal the tile path's bit for bit. The chain is serial, so several panels are in
// flight at once (PanelsInFlight) to keep the FMA units busy.
#ifndef MS_ATB_OPS_QUANT_GEMV_H_
#define MS_ATB_OPS_QUANT_GEMV_H_

#include <cstdint>
#include <cstring>

#include "dtype.h"
#include "quant_layout.h"

#if (defined(__AVX2__) && defined(__FMA__)) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace ms_atb {

// The most rows of x the small-batch path takes: on AVX2 (Zen) it beats the tile path up to 16 rows (re-reading
// each panel from L1 per 4 rows); 8 covers the decode batches where the gap is widest.
constexpr int64_t kGemvMaxRows = 8;


namespace gemv {

// Vec: 16 float32, one panel row. Its operations, per ISA.
#if defined(__AVX512F__)
constexpr int kChains = 8;  // independent accumulators that hide the FMA latency (2 units x 4 cycles)
struct Vec { __m512 v; };
inline Vec Zero() { return {_mm512_setzero_ps()}; }
inline Vec Splat(float a) { return {_mm512_set1_ps(a)}; }
inline Vec Fma(Vec a, Vec b, Vec c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline Vec Mul(Vec a, Vec b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Vec LoadFloats(const uint8_t *p) { return {_mm512_loadu_ps(reinterpret_cast<const float *>(p))}; }
inline void Store(float *p, Vec a) { _mm512_storeu_ps(p, a.v); }
inline Vec Halves(const uint8_t *p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)))};
}
inline __m128i Bytes(const uint8_t *p) { return _mm_loadu_si128(reinterpret_cast<const __m128i *>(p)); }
inline Vec LowNibbles(const uint8_t *p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(Bytes(p), _mm_set1_epi8(15))))};
}
inline Vec HighNibbles(const uint8_t *p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(Bytes(p), 4), _mm_set1_epi8(15))))};
}
inline Vec SignedBytes(const uint8_t *p) { return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(Bytes(p)))}; }
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kChains = 4;  // with the dequantisation's work between them, 4 chains keep up
struct Vec { __m256 lo, hi; };
inline Vec Zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Vec Splat(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
inline Vec Fma(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline Vec Mul(Vec a, Vec b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline Vec LoadFloats(const uint8_t *p) {
  const float *f = reinterpret_cast<const float *>(p);
  return {_mm256_loadu_ps(f), _mm256_loadu_ps(f + 8)};
}
inline void Store(float *p, Vec a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline Vec Halves(const uint8_t *p) {
  const __m128i *h = reinterpret_cast<const __m128i *>(p);
  return {_mm256_cvtph_ps(_mm_loadu_si128(h)), _mm256_cvtph_ps(_mm_loadu_si128(h + 1))};
}
// 8 bytes, each widened to an int32 in the load.
inline __m256i Unsigned8(const uint8_t *p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p)));
}
inline __m256i Signed8(const uint8_t *p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p)));
}
inline Vec LowNibbles(const uint8_t *p) {
  const __m256i mask = _mm256_set1_epi32(15);
  return {_mm256_cvtepi32_ps(_mm256_and_si256(Unsigned8(p), mask)),
          _mm256_cvtepi32_ps(_mm256_and_si256(Unsigned8(p + 8), mask))};
}
inline Vec HighNibbles(const uint8_t *p) {
  return {_mm256_cvtepi32_ps(_mm256_srli_epi32(Unsigned8(p), 4)), _mm256_cvtepi32_ps(_mm256_srli_epi32(Unsigned8(p + 8), 4))};
}
inline Vec SignedBytes(const uint8_t *p) {
  return {_mm256_cvtepi32_ps(Signed8(p)), _mm256_cvtepi32_ps(Signed8(p + 8))};
}
#else
// Portable: plain loops for the compiler's vectoriser, the accumulation written as the portable tile writes it.
constexpr int kChains = 4;
struct Vec { float v[kQuantPanel]; };
inline Vec Splat(float a) {
  Vec r;
  for (int c = 0; c < kQuantPanel; ++c) r.v[c] = a;
  return r;
}
inline Vec Zero() { return Splat(0.0f); }
inline Vec Fma(Vec a, Vec b, Vec c) {
  for (int i = 0; i < kQuantPanel; ++i) c.v[i] += a.v[i] * b.v[i];
  return c;
}
inline Vec Mul(Vec a, Vec b) {
  for (int i = 0; i < kQuantPanel; ++i) a.v[i] *= b.v[i];
  return a;
}
inline Vec LoadFloats(const uint8_t *p) {
  Vec r;
  std::memcpy(r.v, p, sizeof(r.v));
  return r;
}
inline void Store(float *p, Vec a) { std::memcpy(p, a.v, sizeof(a.v)); }
inline Vec Halves(const uint8_t *p) {
  Vec r;
  for (int c = 0; c < kQuantPanel; ++c) {
    Half h;
    std::memcpy(&h.bits, p + 2 * c, 2);
    r.v[c] = ToFloat(h);
  }
  return r;
}
inline Vec LowNibbles(const uint8_t *p) {
  Vec r;
  for (int c = 0; c < kQuantPanel; ++c) r.v[c] = static_cast<float>(p[c] & 15);
  return r;
}
inline Vec HighNibbles(const uint8_t *p) {
  Vec r;
  for (int c = 0; c < kQuantPanel; ++c) r.v[c] = static_cast<float>(p[c] >> 4);
  return r;
}
inline Vec SignedBytes(const uint8_t *p) {
  Vec r;
  for (int c = 0; c < kQuantPanel; ++c) r.v[c] = static_cast<float>(static_cast<int8_t>(p[c]));
  return r;
}
#endif

// acc[r][i] = x[r][k] * w[i] + acc[r][i] for the MR rows of x and NP panels of one row k of W.
template <int MR, int NP>
inline void Accumulate(const float *x, int64_t ldx, const Vec (&w)[NP], Vec (&acc)[MR][NP]) {
  for (int r = 0; r < MR; ++r) {
    const Vec xr = Splat(x[r * ldx]);
    for (int i = 0; i < NP; ++i) acc[r][i] = Fma(xr, w[i], acc[r][i]);
  }
}

// NP panels (panel i at panels + i * panel_bytes) times MR rows of x into y[r * ldy + 16 i ...].
template <QuantFormat F, int MR, int NP>
void Panels(const float *x, int64_t K, const uint8_t *panels, int64_t panel_bytes, float *y, int64_t ldy) {
  Vec acc[MR][NP], w[NP], d[NP], m[NP];
  for (int r = 0; r < MR; ++r)
    for (int i = 0; i < NP; ++i) acc[r][i] = Zero();
  for (int i = 0; i < NP; ++i)
    if constexpr (F == QuantFormat::kInt8) d[i] = LoadFloats(panels + i * panel_bytes);  // per-column scales
  const uint8_t *blocks = panels + QuantHeaderBytes(F);
  for (int64_t k0 = 0; k0 < K; k0 += kQuantBlock) {
    const uint8_t *blk = blocks + k0 / kQuantBlock * QuantBlockBytes(F);  // panel i's block at + i * panel_bytes
    const float *xk = x + k0;
    if constexpr (F == QuantFormat::kInt8) {
      const int64_t n = K - k0 < kQuantBlock ? K - k0 : kQuantBlock;
      for (int64_t k = 0; k < n; ++k) {
        for (int i = 0; i < NP; ++i) w[i] = Mul(d[i], SignedBytes(blk + i * panel_bytes + k * kQuantPanel));
        Accumulate<MR, NP>(xk + k, K, w, acc);
      }
    } else if constexpr (F == QuantFormat::kQ8_0) {
      for (int i = 0; i < NP; ++i) d[i] = Halves(blk + i * panel_bytes);
      for (int64_t k = 0; k < kQuantBlock; ++k) {
        for (int i = 0; i < NP; ++i) w[i] = Mul(d[i], SignedBytes(blk + i * panel_bytes + 32 + k * kQuantPanel));
        Accumulate<MR, NP>(xk + k, K, w, acc);
      }
    } else {
      // w = nibble * d + m, with m = -8 d for Q4_0: nibble * d is exact (4 x 11 significant bits), so fusing
      // the sum rounds as the tile path's dequantisation does.
      for (int i = 0; i < NP; ++i) {
        d[i] = Halves(blk + i * panel_bytes);
        m[i] = F == QuantFormat::kQ4_1 ? Halves(blk + i * panel_bytes + 32) : Mul(Splat(-8.0f), d[i]);
      }
      const int64_t q = F == QuantFormat::kQ4_1 ? 64 : 32;  // offset of the nibbles in a block
      for (int64_t j = 0; j < kQuantBlock / 2; ++j) {  // rows 0..15: low nibbles
        for (int i = 0; i < NP; ++i) w[i] = Fma(LowNibbles(blk + i * panel_bytes + q + j * kQuantPanel), d[i], m[i]);
        Accumulate<MR, NP>(xk + j, K, w, acc);
      }
      for (int64_t j = 0; j < kQuantBlock / 2; ++j) {  // rows 16..31: high nibbles
        for (int i = 0; i < NP; ++i) w[i] = Fma(HighNibbles(blk + i * panel_bytes + q + j * kQuantPanel), d[i], m[i]);
        Accumulate<MR, NP>(xk + kQuantBlock / 2 + j, K, w, acc);
      }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int i = 0; i < NP; ++i) Store(y + r * ldy + i * kQuantPanel, acc[r][i]);
}

// Panels in flight for MR rows: enough chains to cover the FMA latency.
template <int MR>
constexpr int PanelsInFlight() {
#if defined(__AVX512F__)
  constexpr int per_panel = MR;  // one zmm accumulator per row and panel
#elif defined(__AVX2__) && defined(__FMA__)
  constexpr int per_panel = 2 * MR;
#else
  constexpr int per_panel = MR;
#endif
  return kChains / per_panel > 1 ? kChains / per_panel : 1;
}

// Panels [p, p + np) for MR rows: PanelsInFlight<MR> at a time, the odd ones one by one.
template <QuantFormat F, int MR>
void RowGroup(const float *x, int64_t K, const uint8_t *w, int64_t panel_bytes, int64_t p, int64_t np, float *y,
              int64_t ldy) {
  constexpr int NP = PanelsInFlight<MR>();
  int64_t i = p;
  for (; i + NP <= p + np; i += NP) Panels<F, MR, NP>(x, K, w + i * panel_bytes, panel_bytes, y + i * kQuantPanel, ldy);
  for (; i < p + np; ++i) Panels<F, MR, 1>(x, K, w + i * panel_bytes, panel_bytes, y + i * kQuantPanel, ldy);
}

}  // namespace gemv

// Panels a small-batch call takes at a time: a thread's share of a call is a multiple of it.
constexpr int64_t kGemvPanels = gemv::PanelsInFlight<1>();

namespace gemv {

// Panels [p0, p1) for rows [0, M) of x: kGemvPanels panels at a time, for every group of up to 4 rows while
// their bytes are in L1.
template <QuantFormat F>
void PanelRange(int64_t M, const float *x, int64_t K, const uint8_t *w, int64_t panel_bytes, int64_t p0, int64_t p1,
                float *y, int64_t ldy) {
  for (int64_t p = p0; p < p1; p += kGemvPanels) {
    const int64_t np = p1 - p < kGemvPanels ? p1 - p : kGemvPanels;
    for (int64_t r = 0; r < M; r += 4) {
      const float *xr = x + r * K;
      float *yr = y + r * ldy;
      switch (M - r < 4 ? M - r : 4) {
        case 1: RowGroup<F, 1>(xr, K, w, panel_bytes, p, np, yr, ldy); break;
        case 2: RowGroup<F, 2>(xr, K, w, panel_bytes, p, np, yr, ldy); break;
        case 3: RowGroup<F, 3>(xr, K, w, panel_bytes, p, np, yr, ldy); break;
        default: RowGroup<F, 4>(xr, K, w, panel_bytes, p, np, yr, ldy); break;
      }
    }
  }
}

}  // namespace gemv

// y[0:M, 16 p0 : 16 p1] = x[0:M] @ panels [p0, p1), 1 <= M <= kGemvMaxRows; ldy: y's row stride.
template <QuantFormat F>
void QuantGemv(int64_t M, const float *x, int64_t K, const uint8_t *w, int64_t panel_bytes, int64_t p0, int64_t p1,
               float *y, int64_t ldy) {
  gemv::PanelRange<F>(M, x, K, w, panel_bytes, p0, p1, y, ldy);
}

}  // namespace ms_atb

#endif  // MS_ATB_OPS_QUANT_GEMV_H_
