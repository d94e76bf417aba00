// PackedMatMul: y = x @ W for a weight stored in column panels of 16, the layout a register-blocked
// kernel streams with unit stride.
//   x [M, K] float32; w_packed [P, K, 16] float32, panel p holding columns 16p..16p+15 of W [K, N]
//   (zero past N) -> y [M, 16 P] float32.
// PackedMatMulRows(x, w_packed, rows [1] int32): the same for x's first `rows` rows (clamped to [0, M]);
// the rows past them are zero. A static-shape graph padded to its bucket passes its real token count,
// so padding costs no multiply.
// Work is split over (row block, column block) items on the shared thread pool; each output element
// is one thread's dot product in k order, so results do not depend on the thread count.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "dtype.h"
#include "gemm_tile.h"
#include "kernel_profile.h"
#include "thread_pool.h"

namespace {

constexpr int64_t kPanel = ms_atb::kTileCols;  // columns per packed panel
constexpr int64_t kRows = ms_atb::kTileRows;
#if defined(__AVX512F__)
constexpr int64_t kMinPanels = 2;
#else
constexpr int64_t kMinPanels = 1;
#endif

int Fail(const char *msg) {
  std::fprintf(stderr, "ms_atb PackedMatMul: %s\n", msg);
  return 1;
}

}  // namespace

extern "C" std::vector<int64_t> PackedMatMulInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {shapes[0][0], shapes[1][0] * kPanel};
}

namespace {

int Run(int64_t M, int64_t M_total, int64_t K, int64_t P, const float *x, const float *w, float *y) {
  const int64_t N = P * kPanel;
  if (ms_atb::ZeroWithoutProduct(M, M_total, K, N, y)) return 0;
  // Items: row blocks of up to 8 register tiles (x's block stays in L2) times column blocks of 1-4 panels
  // (2-4 with AVX-512, whose tile spans a pair of panels), enough items to keep every thread busy.
  ms_atb::ThreadPool &pool = ms_atb::ThreadPool::Get();
  const int64_t row_block = std::min<int64_t>(M, 8 * kRows);
  const int64_t row_blocks = (M + row_block - 1) / row_block;
  // Wide column blocks when there are few row blocks, so an item streams several panel pairs and can
  // prefetch the next while it multiplies one; about 4 items a thread.
  int64_t panels_per_item = std::max<int64_t>(4, P / (4 * pool.num_threads() * row_blocks) / 2 * 2);
  while (panels_per_item > kMinPanels && row_blocks * (P / panels_per_item) < 4 * pool.num_threads())
    panels_per_item /= 2;
  const int64_t col_blocks = (P + panels_per_item - 1) / panels_per_item;
  pool.Run(row_blocks * col_blocks, [&](int64_t item) {
    const int64_t r0 = (item / col_blocks) * row_block, r1 = std::min(M, r0 + row_block);
    const int64_t p0 = (item % col_blocks) * panels_per_item, p1 = std::min(P, p0 + panels_per_item);
    int64_t p = p0;
#if defined(__AVX512F__)
    const int64_t tiles = (r1 - r0 + kRows - 1) / kRows, slice = (K + tiles - 1) / tiles;
    for (; p + 1 < p1; p += 2) {  // panel pairs: one broadcast of x feeds two FMAs
      // The row tiles of this pair prefetch the next pair into L2, a slice of K rows each.
      const float *next = p + 3 < p1 ? w + (p + 2) * K * kPanel : nullptr;
      for (int64_t r = r0, t = 0; r < r1; r += kRows, ++t)
        ms_atb::GemmRows2(std::min(kRows, r1 - r), x + r * K, K, w + p * K * kPanel, K * kPanel,
                          y + r * N + p * kPanel, N, K, false,
                          next != nullptr && t * slice < K ? next + t * slice * kPanel : nullptr, tiles);
    }
#endif
    for (; p < p1; ++p)
      for (int64_t r = r0; r < r1; r += kRows)
        ms_atb::GemmRows(std::min(kRows, r1 - r), x + r * K, K, 1, w + p * K * kPanel, kPanel,
                         y + r * N + p * kPanel, N, K, false);
  });
  return 0;
}

// Validates x [M, K], w_packed [P, K, 16], (rows [1] int32,) y [M, 16 P]; `expected` = 3 or 4 params.
int Check(int nparam, int expected, int *ndims, int64_t **shapes, const char **dtypes) {
  if (nparam != expected)
    return Fail(expected == 3 ? "expected 2 inputs and 1 output" : "expected 3 inputs and 1 output");
  const int out = expected - 1;
  if (ndims[0] != 2 || ndims[1] != 3 || ndims[out] != 2)
    return Fail("expected x [M, K], w_packed [P, K, 16] and y [M, 16 P]");
  const int64_t M = shapes[0][0], K = shapes[0][1], N = shapes[1][0] * kPanel;
  if (shapes[1][1] != K || shapes[1][2] != kPanel) return Fail("w_packed must be [P, K, 16] with x's K");
  if (shapes[out][0] != M || shapes[out][1] != N) return Fail("y must be [M, 16 P]");
  for (int i : {0, 1, out})
    if (ms_atb::ParseDType(dtypes[i]) != ms_atb::DType::kFloat32)
      return Fail("x, w_packed and y must be float32");
  if (expected == 4 &&
      (ndims[2] != 1 || shapes[2][0] != 1 || ms_atb::ParseDType(dtypes[2]) != ms_atb::DType::kInt32))
    return Fail("rows must be int32 [1]");
  return 0;
}

}  // namespace

extern "C" std::vector<int64_t> PackedMatMulRowsInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {shapes[0][0], shapes[1][0] * kPanel};
}

extern "C" int PackedMatMul(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  ms_atb::KernelScope profile_scope("PackedMatMul");
  if (Check(nparam, 3, ndims, shapes, dtypes) != 0) return 1;
  return Run(shapes[0][0], shapes[0][0], shapes[0][1], shapes[1][0], static_cast<const float *>(params[0]),
             static_cast<const float *>(params[1]), static_cast<float *>(params[2]));
}

extern "C" int PackedMatMulRows(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                void *stream, void *extra) {
  ms_atb::KernelScope profile_scope("PackedMatMul");
  if (Check(nparam, 4, ndims, shapes, dtypes) != 0) return 1;
  const int64_t M = shapes[0][0];
  const int64_t rows = std::clamp<int64_t>(*static_cast<const int32_t *>(params[2]), 0, M);
  return Run(rows, M, shapes[0][1], shapes[1][0], static_cast<const float *>(params[0]),
             static_cast<const float *>(params[1]), static_cast<float *>(params[3]));
}
