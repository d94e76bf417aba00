// QuantPack: GGUF rows of Q8_0, Q4_0 or Q4_1 blocks into the column panels of ops/quant_layout.h, at load. The bits
// are the stored ones, moved: each panel gathers 16 rows (output columns) block by block, in the float layout
// (QuantMatMul) or the dot layout (QuantDot). Columns past the last row are zero.
//   raw [N, K / 32 * GGUF block bytes] uint8 (one row per output column), spec [3] int32 {format (0 Q8_0,
//   1 Q4_0, 2 Q4_1), dot (0 or 1), first panel} -> out [P, panel_bytes] int8 or uint8, written in place: panels
//   first .. first + ceil(N / 16) - 1 (a fused linear's parts are packed into their own panels of one buffer).
// Panels are independent items of the thread pool.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "dtype.h"
#include "quant_layout.h"
#include "thread_pool.h"

namespace {

using ms_atb::QuantFormat;
constexpr int64_t kPanel = ms_atb::kQuantPanel, kBlock = ms_atb::kQuantBlock;

int Fail(const char *msg) {
  std::fprintf(stderr, "ms_atb QuantPack: %s\n", msg);
  return 1;
}

// One block of panel columns [0, n): rows[c] is column c's GGUF block; out: the panel's block.
template <QuantFormat F, bool kDot>
void PackBlock(const uint8_t *const *rows, int64_t n, uint8_t *out) {
  std::memset(out, 0, ms_atb::QuantBlockBytes(F));
  constexpr int64_t scales = F == QuantFormat::kQ4_1 ? 4 : 2;  // bytes of float16 scale (and minimum) a row
  uint8_t *q = out + ms_atb::QuantsAt(F);
  for (int64_t c = 0; c < n; ++c) {
    std::memcpy(out + 2 * c, rows[c], 2);                                            // d
    if constexpr (F == QuantFormat::kQ4_1) std::memcpy(out + 2 * kPanel + 2 * c, rows[c] + 2, 2);   // m
    const uint8_t *src = rows[c] + scales;
    constexpr int64_t bytes = ms_atb::IsNibbles(F) ? kBlock / 2 : kBlock;              // quant bytes a row
    if constexpr (kDot) {
      for (int64_t j = 0; j < bytes; j += 4) std::memcpy(q + 16 * j + 4 * c, src + j, 4);   // 64 (j / 4) + 4 c
    } else {
      for (int64_t j = 0; j < bytes; ++j) q[j * kPanel + c] = src[j];
    }
  }
}

template <QuantFormat F, bool kDot>
void Pack(const uint8_t *raw, int64_t N, int64_t row_bytes, uint8_t *out, int64_t panel_bytes, int64_t first) {
  const int64_t nb = row_bytes / ms_atb::GgufBlockBytes(F), panels = (N + kPanel - 1) / kPanel;
  const int64_t per_item = std::max<int64_t>(1, (4 << 20) / std::max<int64_t>(panel_bytes, 1));   // ~4 MiB
  ms_atb::ThreadPool::Get().Run((panels + per_item - 1) / per_item, [&](int64_t item) {
    for (int64_t p = item * per_item; p < std::min(panels, (item + 1) * per_item); ++p) {
      const int64_t n = std::min(kPanel, N - p * kPanel);
      uint8_t *panel = out + (first + p) * panel_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *rows[kPanel];
        for (int64_t c = 0; c < n; ++c) rows[c] = raw + (p * kPanel + c) * row_bytes + b * ms_atb::GgufBlockBytes(F);
        PackBlock<F, kDot>(rows, n, panel + b * ms_atb::QuantBlockBytes(F));
      }
    }
  });
}

}  // namespace

extern "C" int QuantPack(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                         void *extra) {
  if (nparam != 3 || ndims[0] != 2 || ndims[1] != 1 || shapes[1][0] != 3 || ndims[2] != 2)
    return Fail("expected raw [N, row bytes] uint8, spec [3] int32 and out [P, panel_bytes]");
  if (std::strcmp(dtypes[0], "uint8") != 0 || std::strcmp(dtypes[1], "int32") != 0 ||
      (std::strcmp(dtypes[2], "uint8") != 0 && std::strcmp(dtypes[2], "int8") != 0))
    return Fail("raw must be uint8, spec int32, out int8 or uint8");
  const int32_t *spec = static_cast<const int32_t *>(params[1]);
  if (spec[0] < 0 || spec[0] > 2 || spec[1] < 0 || spec[1] > 1) return Fail("spec: format 0-2 and dot 0-1");
  const QuantFormat f = static_cast<QuantFormat>(spec[0]);
  const int64_t N = shapes[0][0], row_bytes = shapes[0][1], P = shapes[2][0], panel_bytes = shapes[2][1];
  const int64_t gguf = ms_atb::GgufBlockBytes(f), nb = row_bytes / gguf;
  if (row_bytes % gguf != 0 || panel_bytes != nb * ms_atb::QuantBlockBytes(f))
    return Fail("raw rows and out panels must hold the same number of blocks of the format");
  if (spec[2] < 0 || spec[2] + (N + kPanel - 1) / kPanel > P) return Fail("the rows' panels do not fit in out");
  const uint8_t *raw = static_cast<const uint8_t *>(params[0]);
  uint8_t *out = static_cast<uint8_t *>(params[2]);
  const bool dot = spec[1] != 0;
  switch (f) {
    case QuantFormat::kQ8_0:
      (dot ? Pack<QuantFormat::kQ8_0, true> : Pack<QuantFormat::kQ8_0, false>)(raw, N, row_bytes, out, panel_bytes,
                                                                               spec[2]);
      break;
    case QuantFormat::kQ4_0:
      (dot ? Pack<QuantFormat::kQ4_0, true> : Pack<QuantFormat::kQ4_0, false>)(raw, N, row_bytes, out, panel_bytes,
                                                                               spec[2]);
      break;
    default:
      (dot ? Pack<QuantFormat::kQ4_1, true> : Pack<QuantFormat::kQ4_1, false>)(raw, N, row_bytes, out, panel_bytes,
                                                                               spec[2]);
  }
  return 0;
}
