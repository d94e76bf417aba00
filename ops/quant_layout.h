// The panel layout of a weight kept quantized (ops/quant_matmul.cc): formats, block and header sizes, and where
// each weight of a block lies, in the layout of float32 activations (QuantMatMul) and in the dot layout of int8
// activations (QuantDot, ops/quant_dot.h). A panel holds 16 output columns; a block, 32 rows of k of them.
//   Q8_0: block = float16 d[16], then the quants;      Q4_0: float16 d[16], then the nibble bytes;
//   Q4_1: float16 d[16], float16 m[16], then the nibble bytes;   Int8: header float32 s[16]; block = the quants.
// Quants, float layout: Q8_0 / Int8 q[k][c] at k * 16 + c; Q4 byte q[j][c] at j * 16 + c holds row j (low
// nibble) and row j + 16 (high), GGUF's order. Dot layout: groups of 64 bytes hold 4 consecutive k of the 16
// columns, column-major: Q8_0 / Int8 k = 4g + i at 64 g + 4 c + i; Q4 byte 64 g + 4 c + i holds rows 4g + i
// (low) and 16 + 4g + i (high).
#ifndef MS_ATB_OPS_QUANT_LAYOUT_H_
#define MS_ATB_OPS_QUANT_LAYOUT_H_

#include <cstdint>

namespace ms_atb {

enum class QuantFormat { kQ8_0, kQ4_0, kQ4_1, kInt8 };

constexpr int64_t kQuantPanel = 16;  // columns per panel
constexpr int64_t kQuantBlock = 32;  // rows of k per block

constexpr int64_t QuantBlockBytes(QuantFormat f) {
  return f == QuantFormat::kQ8_0 ? 32 + 512 : f == QuantFormat::kQ4_0 ? 32 + 256
         : f == QuantFormat::kQ4_1 ? 64 + 256 : 512;
}
constexpr int64_t QuantHeaderBytes(QuantFormat f) { return f == QuantFormat::kInt8 ? 64 : 0; }
// Offset of the quants in a block (after its scales).
constexpr int64_t QuantsAt(QuantFormat f) {
  return f == QuantFormat::kQ4_1 ? 64 : f == QuantFormat::kInt8 ? 0 : 32;
}
constexpr bool IsNibbles(QuantFormat f) { return f == QuantFormat::kQ4_0 || f == QuantFormat::kQ4_1; }
// Bytes of one GGUF block of 32 weights (one output row's), for the GGUF formats.
constexpr int64_t GgufBlockBytes(QuantFormat f) {
  return f == QuantFormat::kQ8_0 ? 34 : f == QuantFormat::kQ4_0 ? 18 : 20;
}

// Offset, from the block's quants, of the byte holding weight (k, c), 0 <= k < 32; for Q4 formats the weight
// is that byte's high nibble when k >= 16.
constexpr int64_t QuantByte(QuantFormat f, bool dot, int64_t k, int64_t c) {
  const int64_t j = IsNibbles(f) ? k % 16 : k;
  return dot ? 64 * (j / 4) + 4 * c + j % 4 : j * kQuantPanel + c;
}

}  // namespace ms_atb

#endif  // MS_ATB_OPS_QUANT_LAYOUT_H_
