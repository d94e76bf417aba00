// One block's integer sums for QuantDot (ops/quant_dot.h): the weight bytes of the dot layout against x's quants
// (quant_rows.h), per ISA: AVX2 maddubs + madd, AVX-512BW the same on 64 bytes, AVX-512 VNNI dpbusd, portable
// loops. The sums are exact int32; the scales are applied by quant_dot.h.
#ifndef MS_ATB_OPS_QUANT_DOT_SUMS_H_
#define MS_ATB_OPS_QUANT_DOT_SUMS_H_

#include <cstdint>
#include <cstring>

#include "quant_gemv.h"
#include "quant_layout.h"

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
// straight into the sums. Split: q holds the block's nibbles already split into bytes (SplitNibbles).
inline void Chain(__m256i &v) { asm("" : "+x"(v)); }     // as Chain(Ints &)

constexpr bool kSplitNibbles = true;
constexpr int64_t kSplitBlockBytes = kQuantBlock * kQuantPanel;  // a block's 512 nibbles, one byte each
// Split tiles take k in chunks of kSplitChunkBlocks blocks (2,048 k: a panel's split chunk is 32 KiB, read from L2
// by each group of rows), and only with at least kSplitMinRows rows: fewer groups do not repay the split.
// Measured on Zen 3, 2 threads: 512 x 2048 x 8192 334 -> 367 GOP/s, 32 rows 340 -> 370; 8 rows split: 320 -> 305.
constexpr int64_t kSplitChunkBlocks = 64;
constexpr int64_t kSplitMinRows = 9;

// Blocks [b0, b1) of a nibble panel's quants as bytes, kSplitBlockBytes a block: group g's 64 low nibbles at
// 128 g, its 64 high ones at 128 g + 64. A tile of many rows splits a chunk once, and each group of 4 rows then
// loads the bytes instead of masking and shifting them again (a quarter of the instructions of its block).
template <QuantFormat F>
void SplitNibbles(const uint8_t *panel, int64_t b0, int64_t b1, uint8_t *out) {
  const __m256i m = _mm256_set1_epi8(15);
  for (int64_t b = b0; b < b1; ++b, out += kSplitBlockBytes) {
    const uint8_t *q = panel + QuantHeaderBytes(F) + b * QuantBlockBytes(F) + QuantsAt(F);
    for (int h = 0; h < kSplitBlockBytes / 64; ++h) {  // 32 packed bytes in, 32 low and 32 high out
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + 32 * h));
      uint8_t *o = out + 128 * (h / 2) + 32 * (h % 2);
      _mm256_store_si256(reinterpret_cast<__m256i *>(o), _mm256_and_si256(w, m));
      _mm256_store_si256(reinterpret_cast<__m256i *>(o + 64), _mm256_and_si256(_mm256_srli_epi16(w, 4), m));
    }
  }
}

template <QuantFormat F, int MR, int NP, bool Split>
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
      const __m256i *w = reinterpret_cast<const __m256i *>(q + (Split ? 128 : 64) * g);
      const __m256i l0 = Split ? _mm256_load_si256(w) : _mm256_and_si256(_mm256_loadu_si256(w), m);
      const __m256i l1 = Split ? _mm256_load_si256(w + 1) : _mm256_and_si256(_mm256_loadu_si256(w + 1), m);
      for (int r = 0; r < MR; ++r) {
        const __m256i x = _mm256_set1_epi32(Four(xb[r] + 4 * g));
        s0[r] = _mm256_add_epi16(s0[r], _mm256_maddubs_epi16(l0, x));
        s1[r] = _mm256_add_epi16(s1[r], _mm256_maddubs_epi16(l1, x));
        Chain(s0[r]);
        Chain(s1[r]);
      }
      const __m256i h0 = Split ? _mm256_load_si256(w + 2)
                               : _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256(w), 4), m);
      const __m256i h1 = Split ? _mm256_load_si256(w + 3)
                               : _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256(w + 1), 4), m);
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
constexpr bool kSplitNibbles = false;
constexpr int64_t kSplitBlockBytes = 0, kSplitChunkBlocks = 1, kSplitMinRows = 0;
template <QuantFormat F>
void SplitNibbles(const uint8_t *, int64_t, int64_t, uint8_t *) {}

// The loops over a block's groups are unrolled: rolled, GCC keeps a 4 x 2 tile's sums on the stack, a load and a
// store around every dot product (AVX-512 VNNI, Zen 4, M's prompt matmuls at 512 rows: 238 -> 310 GOP/s on one
// thread, 409-469 -> 557-615 on two; Q8_0 and Int8 +40%).
template <QuantFormat F, int MR, int NP, bool Split>
inline void BlockSums(const uint8_t *const *q, const int8_t *const *xb, Ints (*sum)[NP]) {
  static_assert(!Split, "only AVX2 splits nibbles");
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p) sum[r][p] = IntsZero();
  if constexpr (F == QuantFormat::kQ8_0 || F == QuantFormat::kInt8) {
#pragma GCC unroll 8
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
#pragma GCC unroll 4
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

}  // namespace dot
}  // namespace ms_atb

#endif  // MS_ATB_OPS_QUANT_DOT_SUMS_H_
