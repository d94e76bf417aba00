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
#include <cstdint>
#include <cstring>
#include <vector>

#include "prefetch.h"
#include "quant_dot_sums.h"
#include "quant_gemv.h"
#include "quant_rows.h"

namespace ms_atb {
namespace dot {

// Panels a tile of many rows takes at a time: AVX-512's 32 registers hold the sums of 4 rows x 2 panels, so x's
// broadcasts serve two panels and there are twice as many independent chains of dot products.
#if defined(__AVX512F__)
constexpr int kDotPanels = 2;
#else
constexpr int kDotPanels = 1;
#endif
static_assert(!kSplitNibbles || kDotPanels == 1, "split nibbles serve one panel at a time");

// How far ahead of the block it multiplies a pass asks for its panels' bytes (into L1) when it is the first to read
// them from memory: the hardware prefetcher alone keeps too few lines in flight on some cores for a pass with little
// work a byte. Zen 2, a decode step's matmuls of M's shape (604 MB, read once each), 2 threads: at one row 20.4-21.3 ->
// 24.0-25.6 GB/s (the read bound 26-29), one thread 12.1 -> 14.5-14.8 (15.5); 2 rows 18.6 -> 23.2; 8 rows 6.9 -> 8.3
// (what its multiplications allow); 32 rows, the multiplications' bound, unchanged. 768 bytes did as well, 2,048
// and 4,096 worse. Panels are contiguous: the bytes past a panel's end are the next panel's.
constexpr int64_t kStreamAhead = 1024;

// Asks for the cache lines of [p + kStreamAhead, p + kStreamAhead + bytes). The address is formed as an integer: past
// the last panel it points beyond the weights, which a prefetch may name (it never faults) but a pointer may not.
inline void StreamAhead(const uint8_t *p, int64_t bytes) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p) + kStreamAhead;
  for (int64_t o = 0; o < bytes; o += 64) PrefetchL1(at + o);
}

// Blocks [b0, b1) of NP panels (panel[p]) times MR rows of x (rows r of xq from row0), added to acc[r][p];
// split: the one panel's blocks [b0, b1) split by SplitNibbles, or null; stream: this pass is the first to read
// the panels' blocks, so they come from memory (prefetched kStreamAhead bytes ahead).
template <QuantFormat F, int MR, int NP>
void PanelBlocks(const QuantRows &xq, int64_t row0, const uint8_t *const *panel, int64_t b0, int64_t b1,
                 const uint8_t *split, bool stream, Vec (*acc)[NP]) {
  const int64_t nbx = xq.kq / kQuantBlock;
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t *blk[NP], *quants[NP];
    for (int p = 0; p < NP; ++p) {
      blk[p] = panel[p] + QuantHeaderBytes(F) + b * QuantBlockBytes(F);
      quants[p] = blk[p] + QuantsAt(F);
      if (stream) StreamAhead(blk[p], QuantBlockBytes(F));
    }
    const int8_t *xb[MR];
    for (int r = 0; r < MR; ++r) xb[r] = xq.q + (row0 + r) * xq.kq + b * kQuantBlock;
    Ints sum[MR][NP];
    if (kSplitNibbles && IsNibbles(F) && split != nullptr) {
      quants[0] = split + (b - b0) * kSplitBlockBytes;
      BlockSums<F, MR, NP, kSplitNibbles>(quants, xb, sum);
    } else {
      BlockSums<F, MR, NP, false>(quants, xb, sum);
    }
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
// split. split, stream: as PanelBlocks'.
template <QuantFormat F, int MR, int NP>
void PanelRows(const QuantRows &xq, int64_t row0, const uint8_t *panel, int64_t panel_bytes, int64_t b0, int64_t b1,
               const uint8_t *split, bool stream, int64_t nb, float *y, int64_t ldy, int64_t ldp) {
  const uint8_t *panels[NP];
  Vec acc[MR][NP];
  for (int p = 0; p < NP; ++p) panels[p] = panel + p * panel_bytes;
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p)
      acc[r][p] = b0 == 0 ? gemv::Zero() : gemv::LoadFloats(reinterpret_cast<uint8_t *>(y + r * ldy + p * ldp));
  PanelBlocks<F, MR, NP>(xq, row0, panels, b0, b1, split, stream, acc);
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
                    int64_t b0, int64_t b1, const uint8_t *split, bool stream, int64_t nb, float *y, int64_t ldy,
                    int64_t ldp) {
  switch (n) {
    case 1: PanelRows<F, 1, NP>(xq, row0, panel, panel_bytes, b0, b1, split, stream, nb, y, ldy, ldp); break;
    case 2: PanelRows<F, 2, NP>(xq, row0, panel, panel_bytes, b0, b1, split, stream, nb, y, ldy, ldp); break;
    case 3: PanelRows<F, 3, NP>(xq, row0, panel, panel_bytes, b0, b1, split, stream, nb, y, ldy, ldp); break;
    default: PanelRows<F, 4, NP>(xq, row0, panel, panel_bytes, b0, b1, split, stream, nb, y, ldy, ldp); break;
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
// chunks pass, each read once for all the groups of rows. AVX2 tiles of kSplitMinRows rows or more split each
// panel chunk's nibbles first and take chunks of kSplitChunkBlocks blocks (quant_dot_sums.h).
template <QuantFormat F>
void PanelRange(const QuantRows &xq, int64_t r0, int64_t r1, const uint8_t *w, int64_t panel_bytes, int64_t nb,
                int64_t p0, int64_t p1, float *y, int64_t ldy) {
  const int64_t rows = r1 - r0;
  const bool tiled = rows > 4;
  const int64_t tile = tiled ? std::max<int64_t>(1, kDotTileBytes / (rows * kQuantPanel * 4)) : p1 - p0;
  const bool split = kSplitNibbles && IsNibbles(F) && tiled && rows >= kSplitMinRows;
  const int64_t chunk = split ? kSplitChunkBlocks : tiled ? kDotChunkBlocks : nb;
  thread_local std::vector<float> sums;   // [tile panels][rows][16]
  thread_local std::vector<uint8_t> split_bytes;  // [chunk][kSplitBlockBytes], 32-byte aligned
  if (split && split_bytes.size() < static_cast<size_t>(kSplitChunkBlocks * kSplitBlockBytes + 32))
    split_bytes.resize(static_cast<size_t>(kSplitChunkBlocks * kSplitBlockBytes + 32));
  uint8_t *split_chunk = split_bytes.data() + (-reinterpret_cast<uintptr_t>(split_bytes.data()) & 31);
  if (tiled && sums.size() < static_cast<size_t>(tile * rows * kQuantPanel))
    sums.resize(static_cast<size_t>(tile * rows * kQuantPanel));
  for (int64_t t0 = p0; t0 < p1; t0 += tile) {
    const int64_t t1 = std::min(p1, t0 + tile);
    for (int64_t b0 = 0; b0 < nb; b0 += chunk) {
      const int64_t b1 = std::min(nb, b0 + chunk);
      for (int64_t p = t0, np = 1; p < t1; p += np) {
        np = t1 - p >= kDotPanels ? kDotPanels : 1;
        const uint8_t *panel = w + p * panel_bytes;
        const uint8_t *quants = split ? split_chunk : nullptr;   // split quants, or the panel's own
        if (split) SplitNibbles<F>(panel, b0, b1, split_chunk);
        for (int64_t r = r0; r < r1; r += 4) {
          // Later groups of rows find the chunk in L1-L2; a split chunk was read by SplitNibbles.
          const bool stream = !tiled || (r == r0 && !split);
          float *yr = tiled ? sums.data() + ((p - t0) * rows + r - r0) * kQuantPanel : y + r * ldy + p * kQuantPanel;
          const int64_t ld = tiled ? kQuantPanel : ldy, ldp = tiled ? rows * kQuantPanel : kQuantPanel;
          if (np == kDotPanels)
            PanelRowsUpTo4<F, kDotPanels>(r1 - r, xq, r, panel, panel_bytes, b0, b1, quants, stream, nb, yr, ld, ldp);
          else
            PanelRowsUpTo4<F, 1>(r1 - r, xq, r, panel, panel_bytes, b0, b1, quants, stream, nb, yr, ld, ldp);
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
