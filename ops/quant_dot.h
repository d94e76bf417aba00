// The int8-activation path of QuantMatMul (QuantDot<F> of ops/quant_matmul.cc): x is quantized per row and per
// block of 32 k, and each weight block meets it in integer dot products (AVX2: maddubs + madd; AVX-512BW:
// the same on 64 bytes; AVX-512 VNNI: dpbusd; portable: plain loops), scaled to float32 once per block.
//   x block: d_x, its quants q_x and their sum s_x, as quant_rows.h makes them.
//   per block of a column, i = sum over the block's k of q_w * q_x (int32, exact):
//     Q8_0: y += (d_w * d_x) * i
//     Q4_0: y += (d_w * d_x) * (i - 8 s_x)      (q_w: the nibble; the -8 offset through s_x, exactly)
//     Q4_1: y += (d_w * d_x) * i + m_w * (d_x * s_x)
//     Int8: y += d_x * i, and y *= s_w at the end (one scale a column)
// Weight layout (the "dot" layout, packed at load for this path only): quant_matmul.cc's panels with each
// block's quants re-ordered so that 4 consecutive k of one column share a 32-bit lane, the operand the
// integer dot instructions take: a group of 64 bytes holds k = 4g..4g+3 of the 16 columns, column-major.
//   Q8_0 / Int8: 8 groups, group g: k = 4g + j at byte 4c + j.
//   Q4_0 / Q4_1: 4 groups, group g: byte 4c + j holds k = 4g + j (low nibble) and k = 16 + 4g + j (high).
// Headers and scales are where quant_matmul.cc keeps them; the float32-activation layout is not used here.
#ifndef MS_ATB_OPS_QUANT_DOT_H_
#define MS_ATB_OPS_QUANT_DOT_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quant_gemv.h"
#include "quant_rows.h"

namespace ms_atb {
namespace dot {

using gemv::Vec;

// Ints: 16 int32 sums, one a column; Group: 64 weight bytes (16 columns x 4 k). Their operations, per ISA.
#if defined(__AVX512BW__)
struct Ints { __m512i v; };
struct Group { __m512i v; };
inline Ints IntsZero() { return {_mm512_setzero_si512()}; }
inline Group Load(const uint8_t *p) { return {_mm512_loadu_si512(p)}; }
inline Group LowNibbles(Group g) { return {_mm512_and_si512(g.v, _mm512_set1_epi8(15))}; }
inline Group HighNibbles(Group g) { return {_mm512_and_si512(_mm512_srli_epi16(g.v, 4), _mm512_set1_epi8(15))}; }
// acc[c] += sum_j u[4c + j] * x4[j]: u unsigned (at most 128: maddubs' pairs stay within int16), x4 signed.
inline Ints DotUnsigned(Ints acc, Group u, int32_t x4) {
#if defined(__AVX512VNNI__)
  return {_mm512_dpbusd_epi32(acc.v, u.v, _mm512_set1_epi32(x4))};
#else
  const __m512i pairs = _mm512_maddubs_epi16(u.v, _mm512_set1_epi32(x4));
  return {_mm512_add_epi32(acc.v, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))};
#endif
}
// A signed group as |w| and the lanes where w < 0: x takes w's sign, |w| the unsigned operand.
struct Signed { Group abs; __mmask64 neg; };
inline Signed PrepareSigned(Group g) { return {{_mm512_abs_epi8(g.v)}, _mm512_movepi8_mask(g.v)}; }
inline Ints DotSigned(Ints acc, const Signed &w, int32_t x4) {
  const __m512i x = _mm512_set1_epi32(x4);
  const __m512i xs = _mm512_mask_sub_epi8(x, w.neg, _mm512_setzero_si512(), x);
#if defined(__AVX512VNNI__)
  return {_mm512_dpbusd_epi32(acc.v, w.abs.v, xs)};
#else
  return {_mm512_add_epi32(acc.v, _mm512_madd_epi16(_mm512_maddubs_epi16(w.abs.v, xs), _mm512_set1_epi16(1)))};
#endif
}
inline Ints AddInt(Ints a, int32_t b) { return {_mm512_add_epi32(a.v, _mm512_set1_epi32(b))}; }
inline Vec ToVec(Ints a) { return {_mm512_cvtepi32_ps(a.v)}; }
// The sums as they are now, opaque to the optimiser: a chain of integer additions stays a chain (reassociated, it
// becomes a tree whose every product is computed first and spilled to the stack).
inline void Chain(Ints &a) { asm("" : "+v"(a.v)); }
#if defined(__AVX512VNNI__)
using Pairs = Ints;  // dpbusd sums into int32 directly
inline Pairs PairsZero() { return IntsZero(); }
inline Pairs MulAddPairs(Pairs acc, Group u, int32_t x4) { return DotUnsigned(acc, u, x4); }
inline Ints Widen(Pairs p) { return p; }
#else
struct Pairs { __m512i v; };  // 32 int16 sums of pairs, 2 a column
inline Pairs PairsZero() { return {_mm512_setzero_si512()}; }
inline Pairs MulAddPairs(Pairs acc, Group u, int32_t x4) {
  return {_mm512_add_epi16(acc.v, _mm512_maddubs_epi16(u.v, _mm512_set1_epi32(x4)))};
}
inline Ints Widen(Pairs p) { return {_mm512_madd_epi16(p.v, _mm512_set1_epi16(1))}; }
inline void Chain(Pairs &a) { asm("" : "+v"(a.v)); }
#endif
#elif defined(__AVX2__) && (defined(__FMA__) || defined(__AVX512F__))
struct Ints { __m256i lo, hi; };   // columns 0..7, 8..15
struct Group { __m256i lo, hi; };  // bytes 0..31 (columns 0..7), 32..63 (columns 8..15)
inline Ints IntsZero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline Group Load(const uint8_t *p) {
  const __m256i *v = reinterpret_cast<const __m256i *>(p);
  return {_mm256_loadu_si256(v), _mm256_loadu_si256(v + 1)};
}
inline Group LowNibbles(Group g) {
  const __m256i m = _mm256_set1_epi8(15);
  return {_mm256_and_si256(g.lo, m), _mm256_and_si256(g.hi, m)};
}
inline Group HighNibbles(Group g) {
  const __m256i m = _mm256_set1_epi8(15);
  return {_mm256_and_si256(_mm256_srli_epi16(g.lo, 4), m), _mm256_and_si256(_mm256_srli_epi16(g.hi, 4), m)};
}
inline __m256i Dot8(__m256i acc, __m256i u, __m256i x) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
}
inline Ints DotUnsigned(Ints acc, Group u, int32_t x4) {
  const __m256i x = _mm256_set1_epi32(x4);
  return {Dot8(acc.lo, u.lo, x), Dot8(acc.hi, u.hi, x)};
}
struct Signed { Group abs, sign; };
inline Signed PrepareSigned(Group g) { return {{_mm256_abs_epi8(g.lo), _mm256_abs_epi8(g.hi)}, g}; }
inline Ints DotSigned(Ints acc, const Signed &w, int32_t x4) {
  const __m256i x = _mm256_set1_epi32(x4);
  return {Dot8(acc.lo, w.abs.lo, _mm256_sign_epi8(x, w.sign.lo)),
          Dot8(acc.hi, w.abs.hi, _mm256_sign_epi8(x, w.sign.hi))};
}
inline Ints AddInt(Ints a, int32_t b) {
  const __m256i v = _mm256_set1_epi32(b);
  return {_mm256_add_epi32(a.lo, v), _mm256_add_epi32(a.hi, v)};
}
struct Pairs { __m256i lo, hi; };  // int16 sums of pairs, 2 a column
inline Pairs PairsZero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline Pairs MulAddPairs(Pairs acc, Group u, int32_t x4) {
  const __m256i x = _mm256_set1_epi32(x4);
  return {_mm256_add_epi16(acc.lo, _mm256_maddubs_epi16(u.lo, x)),
          _mm256_add_epi16(acc.hi, _mm256_maddubs_epi16(u.hi, x))};
}
inline Ints Widen(Pairs p) {
  const __m256i one = _mm256_set1_epi16(1);
  return {_mm256_madd_epi16(p.lo, one), _mm256_madd_epi16(p.hi, one)};
}
inline void Chain(Ints &a) { asm("" : "+x"(a.lo), "+x"(a.hi)); }     // as the AVX-512 section's
inline void Chain(Pairs &a) { asm("" : "+x"(a.lo), "+x"(a.hi)); }
#if defined(__AVX512F__)
inline Vec ToVec(Ints a) { return {_mm512_cvtepi32_ps(_mm512_inserti64x4(_mm512_castsi256_si512(a.lo), a.hi, 1))}; }
#else
inline Vec ToVec(Ints a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
#endif
#else
struct Ints { int32_t v[kQuantPanel]; };
struct Group { uint8_t v[4 * kQuantPanel]; };
inline Ints IntsZero() { return {}; }
inline Group Load(const uint8_t *p) {
  Group g;
  std::memcpy(g.v, p, sizeof(g.v));
  return g;
}
inline Group LowNibbles(Group g) {
  for (auto &b : g.v) b &= 15;
  return g;
}
inline Group HighNibbles(Group g) {
  for (auto &b : g.v) b >>= 4;
  return g;
}
inline Ints DotUnsigned(Ints acc, Group u, int32_t x4) {
  int8_t x[4];
  std::memcpy(x, &x4, 4);
  for (int c = 0; c < kQuantPanel; ++c)
    for (int j = 0; j < 4; ++j) acc.v[c] += static_cast<int32_t>(u.v[4 * c + j]) * x[j];
  return acc;
}
struct Signed { Group w; };
inline Signed PrepareSigned(Group g) { return {g}; }
inline Ints DotSigned(Ints acc, const Signed &w, int32_t x4) {
  int8_t x[4];
  std::memcpy(x, &x4, 4);
  for (int c = 0; c < kQuantPanel; ++c)
    for (int j = 0; j < 4; ++j) acc.v[c] += static_cast<int32_t>(static_cast<int8_t>(w.w.v[4 * c + j])) * x[j];
  return acc;
}
inline Ints AddInt(Ints a, int32_t b) {
  for (auto &v : a.v) v += b;
  return a;
}
using Pairs = Ints;  // int32 sums: no narrower partial sums to widen
inline Pairs PairsZero() { return IntsZero(); }
inline Pairs MulAddPairs(Pairs acc, Group u, int32_t x4) { return DotUnsigned(acc, u, x4); }
inline Ints Widen(Pairs p) { return p; }
inline void Chain(Ints &) {}
inline Vec ToVec(Ints a) {
  Vec r;
  for (int c = 0; c < kQuantPanel; ++c) r.v[c] = static_cast<float>(a.v[c]);
  return r;
}
#endif

inline int32_t Four(const int8_t *q) {  // 4 quants of x as one 32-bit lane
  int32_t v;
  std::memcpy(&v, q, 4);
  return v;
}

// One block's integer sums for MR rows and NP panels: sum[r][p][c] = sum over the block's k of q_w[k][c] * q_x[r][k]
// (Q4: the nibbles; the Q4_0 offset and the scales come after). q[p]: panel p's block quants; xb[r]: row r's 32
// quants. A row's x is loaded once for all NP panels, each panel's weights once for all MR rows.
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// AVX2, written for its 16 registers: a row's sums of both 8-column halves stay in registers while a group's
// weight bytes are prepared once for all rows (low nibbles, then high ones), and the products of a group go
// straight into the sums.
inline void Chain(__m256i &v) { asm("" : "+x"(v)); }     // as Chain(Ints &)

template <QuantFormat F, int MR, int NP>
inline void BlockSums(const uint8_t *const *qs, const int8_t *const *xb, Ints (*sums)[NP]) {
  static_assert(NP == 1, "AVX2's 16 registers hold one panel's sums");
  const uint8_t *q = qs[0];
  const __m256i one = _mm256_set1_epi16(1);
  __m256i s0[MR], s1[MR];  // columns 0..7, 8..15
  for (int r = 0; r < MR; ++r) s0[r] = s1[r] = _mm256_setzero_si256();
  if constexpr (IsNibbles(F)) {
    // Nibble pairs: each maddubs pair is at most 2 x 15 x 127 = 3810, so a block's 8 of them sum to at most
    // 30480 in int16 before one widening a block.
    const __m256i m = _mm256_set1_epi8(15);
    for (int g = 0; g < kQuantBlock / 8; ++g) {
      const __m256i *w = reinterpret_cast<const __m256i *>(q + 64 * g);
      const __m256i l0 = _mm256_and_si256(_mm256_loadu_si256(w), m);
      const __m256i l1 = _mm256_and_si256(_mm256_loadu_si256(w + 1), m);
      for (int r = 0; r < MR; ++r) {
        const __m256i x = _mm256_set1_epi32(Four(xb[r] + 4 * g));
        s0[r] = _mm256_add_epi16(s0[r], _mm256_maddubs_epi16(l0, x));
        s1[r] = _mm256_add_epi16(s1[r], _mm256_maddubs_epi16(l1, x));
        Chain(s0[r]);
        Chain(s1[r]);
      }
      const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256(w), 4), m);
      const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256(w + 1), 4), m);
      for (int r = 0; r < MR; ++r) {
        const __m256i x = _mm256_set1_epi32(Four(xb[r] + 16 + 4 * g));
        s0[r] = _mm256_add_epi16(s0[r], _mm256_maddubs_epi16(h0, x));
        s1[r] = _mm256_add_epi16(s1[r], _mm256_maddubs_epi16(h1, x));
        Chain(s0[r]);
        Chain(s1[r]);
      }
    }
    for (int r = 0; r < MR; ++r) sums[r][0] = {_mm256_madd_epi16(s0[r], one), _mm256_madd_epi16(s1[r], one)};
  } else {
    // Signed weights: |w| unsigned, x given w's sign; a pair is at most 2 x 127 x 127, widened at once.
    for (int g = 0; g < kQuantBlock / 4; ++g) {
      const __m256i *w = reinterpret_cast<const __m256i *>(q + 64 * g);
      const __m256i w0 = _mm256_loadu_si256(w), w1 = _mm256_loadu_si256(w + 1);
      const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
      for (int r = 0; r < MR; ++r) {
        const __m256i x = _mm256_set1_epi32(Four(xb[r] + 4 * g));
        s0[r] = _mm256_add_epi32(s0[r], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(x, w0)), one));
        s1[r] = _mm256_add_epi32(s1[r], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(x, w1)), one));
        Chain(s0[r]);
        Chain(s1[r]);
      }
    }
    for (int r = 0; r < MR; ++r) sums[r][0] = {s0[r], s1[r]};
  }
}
#else
template <QuantFormat F, int MR, int NP>
inline void BlockSums(const uint8_t *const *q, const int8_t *const *xb, Ints (*sum)[NP]) {
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p) sum[r][p] = IntsZero();
  if constexpr (F == QuantFormat::kQ8_0 || F == QuantFormat::kInt8) {
    for (int g = 0; g < kQuantBlock / 4; ++g) {
      Signed w[NP];
      for (int p = 0; p < NP; ++p) w[p] = PrepareSigned(Load(q[p] + 64 * g));
      for (int r = 0; r < MR; ++r)
        for (int p = 0; p < NP; ++p) {
          sum[r][p] = DotSigned(sum[r][p], w[p], Four(xb[r] + 4 * g));
          Chain(sum[r][p]);
        }
    }
  } else {
    // Nibble pairs: at most 3810 each, 30480 for a block's 8 in int16 (Pairs) before one widening a block.
    Pairs pairs[MR][NP];
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < NP; ++p) pairs[r][p] = PairsZero();
    for (int g = 0; g < kQuantBlock / 8; ++g) {
      Group lo[NP], hi[NP];
      for (int p = 0; p < NP; ++p) {
        const Group w = Load(q[p] + 64 * g);
        lo[p] = LowNibbles(w);
        hi[p] = HighNibbles(w);
      }
      for (int r = 0; r < MR; ++r)
        for (int p = 0; p < NP; ++p) {
          pairs[r][p] = MulAddPairs(pairs[r][p], lo[p], Four(xb[r] + 4 * g));
          Chain(pairs[r][p]);
          pairs[r][p] = MulAddPairs(pairs[r][p], hi[p], Four(xb[r] + 16 + 4 * g));
          Chain(pairs[r][p]);
        }
    }
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < NP; ++p) sum[r][p] = Widen(pairs[r][p]);
  }
}
#endif

// Panels a tile of many rows takes at a time: AVX-512's 32 registers hold the sums of 4 rows x 2 panels, so x's
// broadcasts serve two panels and there are twice as many independent chains of dot products.
#if defined(__AVX512F__)
constexpr int kDotPanels = 2;
#else
constexpr int kDotPanels = 1;
#endif

// Blocks [b0, b1) of NP panels (panel[p]) times MR rows of x (rows r of xq from row0), added to acc[r][p].
template <QuantFormat F, int MR, int NP>
void PanelBlocks(const QuantRows &xq, int64_t row0, const uint8_t *const *panel, int64_t b0, int64_t b1,
                 Vec (*acc)[NP]) {
  const int64_t nbx = xq.kq / kQuantBlock;
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t *blk[NP], *quants[NP];
    for (int p = 0; p < NP; ++p) {
      blk[p] = panel[p] + QuantHeaderBytes(F) + b * QuantBlockBytes(F);
      quants[p] = blk[p] + QuantsAt(F);
    }
    const int8_t *xb[MR];
    for (int r = 0; r < MR; ++r) xb[r] = xq.q + (row0 + r) * xq.kq + b * kQuantBlock;
    Ints sum[MR][NP];
    BlockSums<F, MR, NP>(quants, xb, sum);
    if constexpr (F == QuantFormat::kInt8) {
      for (int r = 0; r < MR; ++r)
        for (int p = 0; p < NP; ++p)
          acc[r][p] = gemv::Fma(ToVec(sum[r][p]), gemv::Splat(xq.d[(row0 + r) * nbx + b]), acc[r][p]);
    } else {
      Vec dw[NP], mw[NP];
      for (int p = 0; p < NP; ++p) {
        dw[p] = gemv::Halves(blk[p]);
        mw[p] = F == QuantFormat::kQ4_1 ? gemv::Halves(blk[p] + 32) : dw[p];
      }
      for (int r = 0; r < MR; ++r) {
        const int64_t i = (row0 + r) * nbx + b;
        for (int p = 0; p < NP; ++p) {
          if constexpr (F == QuantFormat::kQ4_0) sum[r][p] = AddInt(sum[r][p], -8 * xq.s[i]);
          acc[r][p] = gemv::Fma(ToVec(sum[r][p]), gemv::Mul(dw[p], gemv::Splat(xq.d[i])), acc[r][p]);
          if constexpr (F == QuantFormat::kQ4_1)
            acc[r][p] = gemv::Fma(mw[p], gemv::Splat(xq.d[i] * static_cast<float>(xq.s[i])), acc[r][p]);
        }
      }
    }
  }
}

// Blocks [b0, b1) of NP panels (panel, panel + panel_bytes, ...) times MR rows into y[r * ldy + p * ldp ... + 16]:
// the sums so far are read from y unless the range starts at block 0, and an Int8 panel's column scales applied
// when it ends at the last block nb. Each column's sum is one float chain in block order however the blocks are
// split.
template <QuantFormat F, int MR, int NP>
void PanelRows(const QuantRows &xq, int64_t row0, const uint8_t *panel, int64_t panel_bytes, int64_t b0, int64_t b1,
               int64_t nb, float *y, int64_t ldy, int64_t ldp) {
  const uint8_t *panels[NP];
  Vec acc[MR][NP];
  for (int p = 0; p < NP; ++p) panels[p] = panel + p * panel_bytes;
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p)
      acc[r][p] = b0 == 0 ? gemv::Zero() : gemv::LoadFloats(reinterpret_cast<uint8_t *>(y + r * ldy + p * ldp));
  PanelBlocks<F, MR, NP>(xq, row0, panels, b0, b1, acc);
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p) {
      if constexpr (F == QuantFormat::kInt8)
        if (b1 == nb) acc[r][p] = gemv::Mul(acc[r][p], gemv::LoadFloats(panels[p]));
      gemv::Store(y + r * ldy + p * ldp, acc[r][p]);
    }
}

// Up to 4 rows (n) of NP panels: PanelRows with the row count a template argument.
template <QuantFormat F, int NP>
void PanelRowsUpTo4(int64_t n, const QuantRows &xq, int64_t row0, const uint8_t *panel, int64_t panel_bytes,
                    int64_t b0, int64_t b1, int64_t nb, float *y, int64_t ldy, int64_t ldp) {
  switch (n) {
    case 1: PanelRows<F, 1, NP>(xq, row0, panel, panel_bytes, b0, b1, nb, y, ldy, ldp); break;
    case 2: PanelRows<F, 2, NP>(xq, row0, panel, panel_bytes, b0, b1, nb, y, ldy, ldp); break;
    case 3: PanelRows<F, 3, NP>(xq, row0, panel, panel_bytes, b0, b1, nb, y, ldy, ldp); break;
    default: PanelRows<F, 4, NP>(xq, row0, panel, panel_bytes, b0, b1, nb, y, ldy, ldp); break;
  }
}

// A pass of many rows: at most kDotRows rows (an item's row block), k in chunks of kDotChunkBlocks blocks, and at
// most kDotTileBytes of sums. AVX-512 (measured on Zen 4) takes longer chunks of fewer rows: each tile's call
// then runs twice as many blocks, and x's chunk is the same 16 KiB.
#if defined(__AVX512F__)
constexpr int64_t kDotRows = 32;
constexpr int64_t kDotChunkBlocks = 16;  // 512 k: 4.6-8.7 KiB of a panel
#else
constexpr int64_t kDotRows = 64;
constexpr int64_t kDotChunkBlocks = 8;   // 256 k: 2.3-4.3 KiB of a panel
#endif
constexpr int64_t kDotTileBytes = 16 << 10;

// Panels [p0, p1) times rows [r0, r1) of x; y: row 0, column 0 of the output. With more than one group of 4
// rows, the panels go a few at a time, their sums for every row (within kDotTileBytes) kept in a contiguous
// buffer (y's rows, N floats apart, would meet in the same cache sets), and k in chunks of kDotChunkBlocks
// blocks: a chunk of every row's quants (16 KiB) and the sums stay in L1-L2 while the panels'
// chunks pass, each read once for all the groups of rows.
template <QuantFormat F>
void PanelRange(const QuantRows &xq, int64_t r0, int64_t r1, const uint8_t *w, int64_t panel_bytes, int64_t nb,
                int64_t p0, int64_t p1, float *y, int64_t ldy) {
  const int64_t rows = r1 - r0;
  const bool tiled = rows > 4;
  const int64_t tile = tiled ? std::max<int64_t>(1, kDotTileBytes / (rows * kQuantPanel * 4)) : p1 - p0;
  const int64_t chunk = tiled ? kDotChunkBlocks : nb;
  thread_local std::vector<float> sums;   // [tile panels][rows][16]
  if (tiled && sums.size() < static_cast<size_t>(tile * rows * kQuantPanel))
    sums.resize(static_cast<size_t>(tile * rows * kQuantPanel));
  for (int64_t t0 = p0; t0 < p1; t0 += tile) {
    const int64_t t1 = std::min(p1, t0 + tile);
    for (int64_t b0 = 0; b0 < nb; b0 += chunk) {
      const int64_t b1 = std::min(nb, b0 + chunk);
      for (int64_t p = t0, np = 1; p < t1; p += np) {
        np = t1 - p >= kDotPanels ? kDotPanels : 1;
        const uint8_t *panel = w + p * panel_bytes;
        for (int64_t r = r0; r < r1; r += 4) {
          float *yr = tiled ? sums.data() + ((p - t0) * rows + r - r0) * kQuantPanel : y + r * ldy + p * kQuantPanel;
          const int64_t ld = tiled ? kQuantPanel : ldy, ldp = tiled ? rows * kQuantPanel : kQuantPanel;
          if (np == kDotPanels)
            PanelRowsUpTo4<F, kDotPanels>(r1 - r, xq, r, panel, panel_bytes, b0, b1, nb, yr, ld, ldp);
          else
            PanelRowsUpTo4<F, 1>(r1 - r, xq, r, panel, panel_bytes, b0, b1, nb, yr, ld, ldp);
        }
      }
    }
    for (int64_t p = t0; p < t1 && tiled; ++p)
      for (int64_t r = r0; r < r1; ++r)
        std::memcpy(y + r * ldy + p * kQuantPanel, sums.data() + ((p - t0) * rows + r - r0) * kQuantPanel,
                    kQuantPanel * sizeof(float));
  }
}

}  // namespace dot
}  // namespace ms_atb

#endif  // MS_ATB_OPS_QUANT_DOT_H_
