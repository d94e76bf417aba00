// GemmRows (ops/gemm_tile.h) behind a C ABI for test_gemm_tile_bounds.py, compiled there once per
// instruction-set path, with the constants of its two call sites (the compiler vectorises on them):
// C[0:m, 0:n] (+)= A[0:m, 0:K] @ B[0:K, 0:n], in tiles of kTileRows x 16.
#include <algorithm>
#include <cstdint>

#include "gemm_tile.h"

namespace {

template <int64_t kLda, int64_t kKa, int64_t kLdb, bool kAccumulate>
void Tiles(int64_t m, int64_t n, const float *a, int64_t lda, int64_t ka, const float *b, int64_t ldb,
           int64_t panel_stride, float *c, int64_t K) {
  for (int64_t r = 0; r < m; r += ms_atb::kTileRows)
    for (int64_t j = 0; j < n; j += ms_atb::kTileCols)
      ms_atb::GemmRows(std::min(ms_atb::kTileRows, m - r), a + r * (kLda ? kLda : lda), kLda ? kLda : lda,
                       kKa ? kKa : ka, b + j / ms_atb::kTileCols * panel_stride, kLdb ? kLdb : ldb, c + r * n + j, n,
                       K, kAccumulate);
}

}  // namespace

extern "C" {

// PackedMatMul (ops/matmul.cc): A's rows of K values (lda = K, ka = 1), B packed as panels [n / 16, K, 16],
// C = A @ B.
__attribute__((visibility("default"))) void ProbeRows(int64_t m, int64_t n, const float *a, const float *b, float *c,
                                                      int64_t K) {
  Tiles<0, 1, ms_atb::kTileCols, false>(m, n, a, K, 1, b, 0, K * ms_atb::kTileCols, c, K);
}

// PagedAttention's prefill tiles (ops/paged_attention_tiled.h): A is S^T [K, RP] read by column (lda = 1,
// ka = RP), B rows [K, n], C += A @ B.
__attribute__((visibility("default"))) void ProbeScores(int64_t m, int64_t n, const float *a, int64_t rp,
                                                        const float *b, float *c, int64_t K) {
  Tiles<1, 0, 0, true>(m, n, a, 1, rp, b, n, ms_atb::kTileCols, c, K);
}
}
