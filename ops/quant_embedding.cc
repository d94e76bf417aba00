// QuantEmbedding: rows of an embedding kept quantized, dequantised as they are gathered. The embedding [V, K] is
// held as the weight of a linear [K, V] in the panel layout of ops/quant_layout.h (a tied model's lm_head, or an
// untied embedding packed the same way): row v is column v % 16 of panel v / 16, read block by block.
//   ids [T] int32, w [P, panel_bytes] int8 or uint8 -> y [T, K] float32, K = the panels' blocks x 32;
//   QuantEmbedding<F> reads the float layout, QuantEmbedding<F>Dot the dot layout. An id outside [0, 16 P) gives
//   a zero row.
// Values: Q8_0 d * q, Q4_0 d * (nibble - 8), Q4_1 d * nibble + m, each rounded once: those of the gguf package's
// dequantisation (nibble * d is exact in float32).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "dtype.h"
#include "quant_layout.h"

namespace {

using ms_atb::QuantFormat;
constexpr int64_t kPanel = ms_atb::kQuantPanel, kBlock = ms_atb::kQuantBlock;

int Fail(const char *kernel, const char *msg) {
  std::fprintf(stderr, "ms_atb %s: %s\n", kernel, msg);
  return 1;
}

inline float HalfAt(const uint8_t *p) {
  ms_atb::Half h;
  std::memcpy(&h.bits, p, 2);
  return ms_atb::ToFloat(h);
}

// Column c of one panel's block into y[0:32].
template <QuantFormat F, bool kDot>
void GatherBlock(const uint8_t *blk, int64_t c, float *y) {
  const float d = HalfAt(blk + 2 * c);
  const float m = F == QuantFormat::kQ4_1 ? HalfAt(blk + 2 * kPanel + 2 * c) : -8.0f * d;
  const uint8_t *q = blk + ms_atb::QuantsAt(F);
  for (int64_t k = 0; k < kBlock; ++k) {
    const uint8_t byte = q[ms_atb::QuantByte(F, kDot, k, c)];
    if constexpr (F == QuantFormat::kQ8_0) {
      y[k] = d * static_cast<float>(static_cast<int8_t>(byte));
    } else {
      const int nibble = k < kBlock / 2 ? byte & 15 : byte >> 4;
      y[k] = static_cast<float>(nibble) * d + m;   // one rounding: nibble * d is exact
    }
  }
}

template <QuantFormat F, bool kDot>
int Gather(const char *kernel, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  if (nparam != 3 || ndims[0] != 1 || ndims[1] != 2 || ndims[2] != 2)
    return Fail(kernel, "expected ids [T] int32, w [P, panel_bytes] and y [T, K]");
  const int64_t T = shapes[0][0], P = shapes[1][0], panel_bytes = shapes[1][1];
  const int64_t nb = panel_bytes / ms_atb::QuantBlockBytes(F), K = nb * kBlock;
  if (panel_bytes % ms_atb::QuantBlockBytes(F) != 0) return Fail(kernel, "w's panels are not whole blocks");
  if (shapes[2][0] != T || shapes[2][1] != K) return Fail(kernel, "y must be [T, 32 x blocks a panel]");
  if (std::strcmp(dtypes[0], "int32") != 0 || std::strcmp(dtypes[2], "float32") != 0)
    return Fail(kernel, "ids must be int32 and y float32");
  const int32_t *ids = static_cast<const int32_t *>(params[0]);
  const uint8_t *w = static_cast<const uint8_t *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  for (int64_t t = 0; t < T; ++t) {
    float *row = y + t * K;
    const int64_t v = ids[t];
    if (v < 0 || v >= P * kPanel) {
      std::memset(row, 0, sizeof(float) * K);
      continue;
    }
    const uint8_t *panel = w + v / kPanel * panel_bytes;
    for (int64_t b = 0; b < nb; ++b)
      GatherBlock<F, kDot>(panel + b * ms_atb::QuantBlockBytes(F), v % kPanel, row + b * kBlock);
  }
  return 0;
}

}  // namespace

#define MS_ATB_QUANT_EMBEDDING(NAME, FORMAT, DOT)                                                             \
  extern "C" std::vector<int64_t> NAME##InferShape(int *ndims, int64_t **shapes, void *extra) {             \
    return {shapes[0][0], shapes[1][1] / ms_atb::QuantBlockBytes(FORMAT) * kBlock};                         \
  }                                                                                                         \
  extern "C" int NAME(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,         \
                      void *stream, void *extra) {                                                          \
    return Gather<FORMAT, DOT>(#NAME, nparam, params, ndims, shapes, dtypes);                               \
  }

MS_ATB_QUANT_EMBEDDING(QuantEmbeddingQ8_0, QuantFormat::kQ8_0, false)
MS_ATB_QUANT_EMBEDDING(QuantEmbeddingQ4_0, QuantFormat::kQ4_0, false)
MS_ATB_QUANT_EMBEDDING(QuantEmbeddingQ4_1, QuantFormat::kQ4_1, false)
MS_ATB_QUANT_EMBEDDING(QuantEmbeddingQ8_0Dot, QuantFormat::kQ8_0, true)
MS_ATB_QUANT_EMBEDDING(QuantEmbeddingQ4_0Dot, QuantFormat::kQ4_0, true)
MS_ATB_QUANT_EMBEDDING(QuantEmbeddingQ4_1Dot, QuantFormat::kQ4_1, true)
#undef MS_ATB_QUANT_EMBEDDING
