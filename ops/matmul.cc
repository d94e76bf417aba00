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

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "dtype.h"
#include "kernel_profile.h"
#include "thread_pool.h"

namespace {

constexpr int64_t kPanel = 16;  // columns per packed panel
constexpr int64_t kRows = 6;    // rows per register tile: 6 x 16 accumulators = 12 ymm registers

int Fail(const char *msg) {
  std::fprintf(stderr, "ms_atb PackedMatMul: %s\n", msg);
  return 1;
}

// y[0:MR, 0:16] = x[0:MR, 0:K] @ panel[0:K, 0:16]; rows of x are ldx apart, rows of y ldy apart.
template <int MR>
void Tile(const float *__restrict x, int64_t ldx, const float *__restrict panel, float *__restrict y,
          int64_t ldy, int64_t K) {
#if defined(__AVX2__) && defined(__FMA__)
  // Named accumulators (not an array) so that the compiler keeps all of them in registers.
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_loadu_ps(panel + k * kPanel), b1 = _mm256_loadu_ps(panel + k * kPanel + 8);
    __m256 a;
#define MS_ATB_ROW(i)                                      \
    if constexpr (MR > i) {                                \
      a = _mm256_broadcast_ss(x + i * ldx + k);            \
      c##i##0 = _mm256_fmadd_ps(a, b0, c##i##0);           \
      c##i##1 = _mm256_fmadd_ps(a, b1, c##i##1);           \
    }
    MS_ATB_ROW(0) MS_ATB_ROW(1) MS_ATB_ROW(2) MS_ATB_ROW(3) MS_ATB_ROW(4) MS_ATB_ROW(5)
#undef MS_ATB_ROW
  }
#define MS_ATB_STORE(i)                                    \
  if constexpr (MR > i) {                                  \
    _mm256_storeu_ps(y + i * ldy, c##i##0);                \
    _mm256_storeu_ps(y + i * ldy + 8, c##i##1);            \
  }
  MS_ATB_STORE(0) MS_ATB_STORE(1) MS_ATB_STORE(2) MS_ATB_STORE(3) MS_ATB_STORE(4) MS_ATB_STORE(5)
#undef MS_ATB_STORE
#else
  // Portable path (no AVX2/FMA): the same loop order, left to the compiler's vectoriser.
  float acc[MR][kPanel] = {};
  for (int64_t k = 0; k < K; ++k)
    for (int i = 0; i < MR; ++i) {
      const float a = x[i * ldx + k];
      for (int64_t j = 0; j < kPanel; ++j) acc[i][j] += a * panel[k * kPanel + j];
    }
  for (int i = 0; i < MR; ++i) std::memcpy(y + i * ldy, acc[i], sizeof(acc[i]));
#endif
}

void Rows(int64_t m, const float *x, int64_t ldx, const float *panel, float *y, int64_t ldy, int64_t K) {
  switch (m) {
    case 6: Tile<6>(x, ldx, panel, y, ldy, K); break;
    case 5: Tile<5>(x, ldx, panel, y, ldy, K); break;
    case 4: Tile<4>(x, ldx, panel, y, ldy, K); break;
    case 3: Tile<3>(x, ldx, panel, y, ldy, K); break;
    case 2: Tile<2>(x, ldx, panel, y, ldy, K); break;
    case 1: Tile<1>(x, ldx, panel, y, ldy, K); break;
    default: break;
  }
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
  // Items: row blocks of up to 48 rows (x's block stays in L2) times column blocks of 1-4 panels,
  // enough items to keep every thread busy.
  ms_atb::ThreadPool &pool = ms_atb::ThreadPool::Get();
  const int64_t row_block = std::min<int64_t>(M, 8 * kRows);
  const int64_t row_blocks = (M + row_block - 1) / row_block;
  int64_t panels_per_item = 4;
  while (panels_per_item > 1 && row_blocks * (P / panels_per_item) < 8 * pool.num_threads()) panels_per_item /= 2;
  const int64_t col_blocks = (P + panels_per_item - 1) / panels_per_item;
  pool.Run(row_blocks * col_blocks, [&](int64_t item) {
    const int64_t r0 = (item / col_blocks) * row_block, r1 = std::min(M, r0 + row_block);
    const int64_t p0 = (item % col_blocks) * panels_per_item, p1 = std::min(P, p0 + panels_per_item);
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t r = r0; r < r1; r += kRows)
        Rows(std::min(kRows, r1 - r), x + r * K, K, w + p * K * kPanel, y + r * N + p * kPanel, N, K);
  });
  return 0;
}
