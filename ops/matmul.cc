// PackedMatMul: y = x @ W for a weight stored in column panels of 16, the layout a register-blocked
// kernel streams with unit stride.
//   x [M, K] float32; w_packed [P, K, 16] float32, panel p holding columns 16p..16p+15 of W [K, N]
//   (zero past N) -> y [M, 16 P] float32.
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

extern "C" int PackedMatMul(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  ms_atb::KernelScope profile_scope("PackedMatMul");
  if (nparam != 3) return Fail("expected 2 inputs and 1 output");
  if (ndims[0] != 2 || ndims[1] != 3 || ndims[2] != 2)
    return Fail("expected x [M, K], w_packed [P, K, 16] and y [M, 16 P]");
  const int64_t M = shapes[0][0], K = shapes[0][1], P = shapes[1][0], N = P * kPanel;
  if (shapes[1][1] != K || shapes[1][2] != kPanel) return Fail("w_packed must be [P, K, 16] with x's K");
  if (shapes[2][0] != M || shapes[2][1] != N) return Fail("y must be [M, 16 P]");
  for (int i = 0; i < 3; ++i)
    if (ms_atb::ParseDType(dtypes[i]) != ms_atb::DType::kFloat32) return Fail("dtype must be float32");
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  if (M == 0 || P == 0) return 0;
  if (K == 0) {
    std::memset(y, 0, sizeof(float) * M * N);
    return 0;
  }
  // Items: row blocks of up to 8 register tiles (x's block stays in L2) times column blocks of 1-4 panels
  // (2-4 with AVX-512, whose tile spans a pair of panels), enough items to keep every thread busy.
  ms_atb::ThreadPool &pool = ms_atb::ThreadPool::Get();
  const int64_t row_block = std::min<int64_t>(M, 8 * kRows);
  const int64_t row_blocks = (M + row_block - 1) / row_block;
  int64_t panels_per_item = 4;
  while (panels_per_item > kMinPanels && row_blocks * (P / panels_per_item) < 8 * pool.num_threads()) panels_per_item /= 2;
  const int64_t col_blocks = (P + panels_per_item - 1) / panels_per_item;
  pool.Run(row_blocks * col_blocks, [&](int64_t item) {
    const int64_t r0 = (item / col_blocks) * row_block, r1 = std::min(M, r0 + row_block);
    const int64_t p0 = (item % col_blocks) * panels_per_item, p1 = std::min(P, p0 + panels_per_item);
    int64_t p = p0;
#if defined(__AVX512F__)
    for (; p + 1 < p1; p += 2)  // panel pairs: one broadcast of x feeds two FMAs
      for (int64_t r = r0; r < r1; r += kRows)
        ms_atb::GemmRows2(std::min(kRows, r1 - r), x + r * K, K, w + p * K * kPanel, K * kPanel,
                          y + r * N + p * kPanel, N, K);
#endif
    for (; p < p1; ++p)
      for (int64_t r = r0; r < r1; r += kRows)
        ms_atb::GemmRows(std::min(kRows, r1 - r), x + r * K, K, 1, w + p * K * kPanel, kPanel, y + r * N + p * kPanel, N,
                         K, false);
  });
  return 0;
}
