// QuantMatMul: y = x @ W for a weight kept quantized in column panels of 16. Up to kGemvMaxRows rows of x
// (decode at small batches) take the register GEMV of quant_gemv.h over runs of panels. Past them, each
// item dequantises a chunk of its panels' rows into a small L1 buffer, once, and runs the float32 register
// tile of gemm_tile.h over every row of x it owns: the dequantisation is shared by all the rows of a batch.
// Both paths round as the float tile does: y equals PackedMatMul's over the dequantised W bit for bit.
//   x [M, K] float32; w [P, panel_bytes] int8 (raw bytes), panel p holding columns 16p..16p+15 of
//   W [K, N] (zero past N) -> y [M, 16 P] float32.
// A panel is a header, then ceil(K / 32) blocks of 32 rows of k (c: column in the panel, 0..15):
//   Q8_0: block = float16 d[16], int8 q[32][16];              w[k][c] = d[c] * q[k][c]
//   Q4_0: block = float16 d[16], uint8 q[16][16];             w[k][c] = d[c] * (nibble - 8)
//   Q4_1: block = float16 d[16], float16 m[16], uint8 q[16][16]; w[k][c] = d[c] * nibble + m[c]
//   Int8: header float32 s[16]; block = int8 q[32][16];       w[k][c] = s[c] * q[k][c]
// Q4 bytes: q[j][c] holds row j (low nibble) and row j + 16 (high nibble) of column c, GGUF's order, so
// a GGUF block converts to this layout by a transpose. The GGUF formats need K a multiple of 32; Int8's
// last block may be partial (its rows past K are never read).
// QuantMatMul<F>Rows(x, w, rows [1] int32): the same for x's first `rows` rows; the others are zero.
// QuantDot<F> and QuantDot<F>Rows: the same product with x quantized to int8 per row and block of 32 and the
// weight in the dot layout of quant_dot.h (integer dot products, one float32 scaling a block).
// Each output element is one thread's dot product in k order: results do not depend on the thread count.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "dtype.h"
#include "gemm_tile.h"
#include "kernel_profile.h"
#include "quant_dot.h"
#include "quant_gemv.h"
#include "thread_pool.h"

namespace {

static_assert(ms_atb::kQuantPanel == ms_atb::kTileCols, "a panel is one register tile wide");
constexpr int64_t kPanel = ms_atb::kQuantPanel;  // columns per panel
constexpr int64_t kBlock = ms_atb::kQuantBlock;  // rows of k per block
constexpr int64_t kGemvItemBytes = 32 << 10;  // the least weight bytes of a small-batch item
constexpr int64_t kChunkBlocks = 4;            // blocks dequantised at a time: 128 x 16 floats = 8 KiB a panel
#if defined(__AVX512F__)
constexpr int64_t kGroup = 2;  // panels dequantised together: the AVX-512 tile spans a pair
#else
constexpr int64_t kGroup = 1;
#endif

using Format = ms_atb::QuantFormat;
constexpr int64_t BlockBytes(Format f) { return ms_atb::QuantBlockBytes(f); }
constexpr int64_t HeaderBytes(Format f) { return ms_atb::QuantHeaderBytes(f); }
constexpr const char *Name(Format f, bool dot = false) {
  if (dot)
    return f == Format::kQ8_0 ? "QuantDotQ8_0" : f == Format::kQ4_0 ? "QuantDotQ4_0"
           : f == Format::kQ4_1 ? "QuantDotQ4_1" : "QuantDotInt8";
  return f == Format::kQ8_0 ? "QuantMatMulQ8_0" : f == Format::kQ4_0 ? "QuantMatMulQ4_0"
         : f == Format::kQ4_1 ? "QuantMatMulQ4_1" : "QuantMatMulInt8";
}

int Fail(const char *kernel, const char *msg) {
  std::fprintf(stderr, "ms_atb %s: %s\n", kernel, msg);
  return 1;
}

inline void Scales(const uint8_t *halves, float *out) {  // 16 float16 (unaligned) -> float32
  for (int c = 0; c < kPanel; ++c) {
    ms_atb::Half h;
    std::memcpy(&h.bits, halves + 2 * c, 2);
    out[c] = ms_atb::ToFloat(h);
  }
}

// Rows [0, n) of one block into out[n][16]; header: the panel's header (Int8's scales).
template <Format F>
inline void DequantBlock(const uint8_t *__restrict blk, const float *__restrict header, int64_t n,
                         float *__restrict out) {
  if constexpr (F == Format::kInt8) {
    const int8_t *q = reinterpret_cast<const int8_t *>(blk);
    for (int64_t k = 0; k < n; ++k)
#pragma omp simd
      for (int c = 0; c < kPanel; ++c) out[k * kPanel + c] = header[c] * q[k * kPanel + c];
  } else if constexpr (F == Format::kQ8_0) {
    float d[kPanel];
    Scales(blk, d);
    const int8_t *q = reinterpret_cast<const int8_t *>(blk + 32);
    for (int64_t k = 0; k < kBlock; ++k)
#pragma omp simd
      for (int c = 0; c < kPanel; ++c) out[k * kPanel + c] = d[c] * q[k * kPanel + c];
  } else {
    float d[kPanel], m[kPanel];
    Scales(blk, d);
    const uint8_t *q;
    if constexpr (F == Format::kQ4_1) {
      Scales(blk + 32, m);
      q = blk + 64;
    } else {
      for (int c = 0; c < kPanel; ++c) m[c] = -8.0f * d[c];  // d * (nibble - 8), exactly: 8 d is exact
      q = blk + 32;
    }
    for (int64_t j = 0; j < kBlock / 2; ++j) {
      float *lo = out + j * kPanel, *hi = out + (j + kBlock / 2) * kPanel;
#pragma omp simd
      for (int c = 0; c < kPanel; ++c) {
        const int byte = q[j * kPanel + c];
        lo[c] = static_cast<float>(byte & 15) * d[c] + m[c];
        hi[c] = static_cast<float>(byte >> 4) * d[c] + m[c];
      }
    }
  }
}

template <Format F>
int Run(int64_t M, int64_t M_total, int64_t K, int64_t P, const float *x, const uint8_t *w, float *y) {
  const int64_t N = P * kPanel;
  const int64_t panel_bytes = HeaderBytes(F) + (K + kBlock - 1) / kBlock * BlockBytes(F);
  if (ms_atb::ZeroWithoutProduct(M, M_total, K, N, y)) return 0;
  ms_atb::ThreadPool &pool = ms_atb::ThreadPool::Get();
  if (M <= ms_atb::kGemvMaxRows) {
    // Items of whole panel groups, about 4 a thread but at least kGemvItemBytes of weights each: smaller
    // items would take about as long as handing them to a thread.
    const int64_t group = ms_atb::kGemvPanels;
    const int64_t by_threads = (P + 4 * pool.num_threads() - 1) / (4 * pool.num_threads());
    const int64_t by_bytes = (kGemvItemBytes + panel_bytes - 1) / panel_bytes;
    const int64_t per_item = (std::max(by_threads, by_bytes) + group - 1) / group * group;
    pool.Run((P + per_item - 1) / per_item, [&](int64_t item) {
      const int64_t p0 = item * per_item, p1 = std::min(P, p0 + per_item);
      ms_atb::QuantGemv<F>(M, x, K, w, panel_bytes, p0, p1, y, N);
    });
    return 0;
  }
  // Items: row blocks (a whole decode batch is one, so each block is dequantised once per batch) times
  // groups of panels, enough items to keep every thread busy.
  const int64_t row_block = std::min<int64_t>(M, 16 * ms_atb::kTileRows);
  const int64_t row_blocks = (M + row_block - 1) / row_block;
  int64_t groups_per_item = std::max<int64_t>(1, P / kGroup / (4 * pool.num_threads() * row_blocks));
  const int64_t groups = (P + kGroup - 1) / kGroup;
  const int64_t col_blocks = (groups + groups_per_item - 1) / groups_per_item;
  pool.Run(row_blocks * col_blocks, [&](int64_t item) {
    alignas(64) float buf[kGroup * kChunkBlocks * kBlock * kPanel];  // [group panel][chunk row][16]
    const int64_t r0 = (item / col_blocks) * row_block, r1 = std::min(M, r0 + row_block);
    const int64_t g0 = (item % col_blocks) * groups_per_item, g1 = std::min(groups, g0 + groups_per_item);
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t p0 = g * kGroup, np = std::min(P - p0, kGroup);
      for (int64_t k0 = 0; k0 < K; k0 += kChunkBlocks * kBlock) {
        const int64_t kc = std::min(K - k0, kChunkBlocks * kBlock);  // rows of this chunk
        for (int64_t i = 0; i < np; ++i) {
          const uint8_t *panel = w + (p0 + i) * panel_bytes;
          float header[kPanel] = {};  // Int8's scales
          if constexpr (HeaderBytes(F) > 0) std::memcpy(header, panel, sizeof(header));
          for (int64_t b = 0; b * kBlock < kc; ++b)
            DequantBlock<F>(panel + HeaderBytes(F) + (k0 / kBlock + b) * BlockBytes(F), header,
                            std::min(kBlock, kc - b * kBlock), buf + (i * kc + b * kBlock) * kPanel);
        }
        ms_atb::PanelProduct(r1 - r0, x + r0 * K + k0, K, buf, kc * kPanel, np, kc, y + r0 * N + p0 * kPanel, N,
                             k0 > 0);
      }
    }
  });
  return 0;
}

// The int8-activation product (quant_dot.h): x's valid rows quantized once, then items of row blocks times
// runs of panels, each panel read for every 4 rows of its item while in L1.
template <Format F>
int RunDot(int64_t M, int64_t M_total, int64_t K, int64_t P, const float *x, const uint8_t *w, float *y) {
  const int64_t N = P * kPanel, nb = (K + kBlock - 1) / kBlock, kq = nb * kBlock;
  const int64_t panel_bytes = HeaderBytes(F) + nb * BlockBytes(F);
  if (ms_atb::ZeroWithoutProduct(M, M_total, K, N, y)) return 0;
  ms_atb::ThreadPool &pool = ms_atb::ThreadPool::Get();
  std::vector<int8_t> q(M * kq);      // [M][kq]
  std::vector<float> d(M * nb);       // [M][nb]
  std::vector<int32_t> s(M * nb);     // [M][nb]
  const ms_atb::dot::QuantRows xq{q.data(), d.data(), s.data(), kq};
  auto quantize = [&](int64_t r) { ms_atb::dot::QuantizeRow(x + r * K, K, &q[r * kq], &d[r * nb], &s[r * nb]); };
  if (M <= ms_atb::kGemvMaxRows) {
    for (int64_t r = 0; r < M; ++r) quantize(r);
  } else {
    pool.Run(M, quantize);
  }
  // Items: row blocks of up to kDotRows rows times runs of panels, about 8 items a thread, each at least
  // kGemvItemBytes of weights (smaller items take about as long as handing them to a thread).
  const int64_t row_block = std::min<int64_t>(M, ms_atb::dot::kDotRows), row_blocks = (M + row_block - 1) / row_block;
  const int64_t by_threads = (P * row_blocks + 8 * pool.num_threads() - 1) / (8 * pool.num_threads());
  const int64_t per_item = std::min(P, std::max(by_threads, (kGemvItemBytes + panel_bytes - 1) / panel_bytes));
  const int64_t col_blocks = (P + per_item - 1) / per_item;
  pool.Run(row_blocks * col_blocks, [&](int64_t item) {
    const int64_t r0 = item / col_blocks * row_block, r1 = std::min(M, r0 + row_block);
    const int64_t p0 = item % col_blocks * per_item, p1 = std::min(P, p0 + per_item);
    ms_atb::dot::PanelRange<F>(xq, r0, r1, w, panel_bytes, nb, p0, p1, y, N);
  });
  return 0;
}

// Validates x [M, K], w [P, panel_bytes], (rows [1] int32,) y [M, 16 P]; `expected` = 3 or 4 params.
template <Format F>
int Check(int nparam, int expected, int *ndims, int64_t **shapes, const char **dtypes, bool dot) {
  const char *kernel = Name(F, dot);
  if (nparam != expected)
    return Fail(kernel, expected == 3 ? "expected 2 inputs and 1 output" : "expected 3 inputs and 1 output");
  const int out = expected - 1;
  if (ndims[0] != 2 || ndims[1] != 2 || ndims[out] != 2)
    return Fail(kernel, "expected x [M, K], w [P, panel_bytes] and y [M, 16 P]");
  const int64_t M = shapes[0][0], K = shapes[0][1], N = shapes[1][0] * kPanel;
  if (F != Format::kInt8 && K % kBlock != 0) return Fail(kernel, "K must be a multiple of 32 for GGUF blocks");
  if (shapes[1][1] != HeaderBytes(F) + (K + kBlock - 1) / kBlock * BlockBytes(F))
    return Fail(kernel, "w's panels do not hold ceil(K / 32) blocks of this format for x's K");
  if (shapes[out][0] != M || shapes[out][1] != N) return Fail(kernel, "y must be [M, 16 P]");
  if (ms_atb::ParseDType(dtypes[0]) != ms_atb::DType::kFloat32 ||
      ms_atb::ParseDType(dtypes[out]) != ms_atb::DType::kFloat32)
    return Fail(kernel, "x and y must be float32");
  if (ms_atb::ParseDType(dtypes[1]) != ms_atb::DType::kInt8 && std::strcmp(dtypes[1], "uint8") != 0)
    return Fail(kernel, "w must be int8 or uint8 (raw bytes)");
  if (expected == 4 &&
      (ndims[2] != 1 || shapes[2][0] != 1 || ms_atb::ParseDType(dtypes[2]) != ms_atb::DType::kInt32))
    return Fail(kernel, "rows must be int32 [1]");
  return 0;
}

template <Format F>
int Call(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, bool with_rows,
         bool dot) {
  ms_atb::KernelScope profile_scope(Name(F, dot));
  if (Check<F>(nparam, with_rows ? 4 : 3, ndims, shapes, dtypes, dot) != 0) return 1;
  const int64_t M = shapes[0][0];
  const int64_t rows = with_rows ? std::clamp<int64_t>(*static_cast<const int32_t *>(params[2]), 0, M) : M;
  return (dot ? RunDot<F> : Run<F>)(rows, M, shapes[0][1], shapes[1][0], static_cast<const float *>(params[0]),
                                    static_cast<const uint8_t *>(params[1]),
                                    static_cast<float *>(params[with_rows ? 3 : 2]));
}

}  // namespace

#define MS_ATB_QUANT_MATMUL(NAME, FORMAT, DOT)                                                                 \
  extern "C" std::vector<int64_t> NAME##InferShape(int *ndims, int64_t **shapes, void *extra) {             \
    return {shapes[0][0], shapes[1][0] * kPanel};                                                           \
  }                                                                                                         \
  extern "C" std::vector<int64_t> NAME##RowsInferShape(int *ndims, int64_t **shapes, void *extra) {         \
    return {shapes[0][0], shapes[1][0] * kPanel};                                                           \
  }                                                                                                         \
  extern "C" int NAME(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,         \
                      void *stream, void *extra) {                                                          \
    return Call<FORMAT>(nparam, params, ndims, shapes, dtypes, false, DOT);                                 \
  }                                                                                                         \
  extern "C" int NAME##Rows(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,   \
                            void *stream, void *extra) {                                                    \
    return Call<FORMAT>(nparam, params, ndims, shapes, dtypes, true, DOT);                                  \
  }

MS_ATB_QUANT_MATMUL(QuantMatMulQ8_0, Format::kQ8_0, false)
MS_ATB_QUANT_MATMUL(QuantMatMulQ4_0, Format::kQ4_0, false)
MS_ATB_QUANT_MATMUL(QuantMatMulQ4_1, Format::kQ4_1, false)
MS_ATB_QUANT_MATMUL(QuantMatMulInt8, Format::kInt8, false)
MS_ATB_QUANT_MATMUL(QuantDotQ8_0, Format::kQ8_0, true)
MS_ATB_QUANT_MATMUL(QuantDotQ4_0, Format::kQ4_0, true)
MS_ATB_QUANT_MATMUL(QuantDotQ4_1, Format::kQ4_1, true)
MS_ATB_QUANT_MATMUL(QuantDotInt8, Format::kInt8, true)
#undef MS_ATB_QUANT_MATMUL
