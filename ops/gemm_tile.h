// The register tile shared by the GEMM-shaped kernels: C[0:MR, 0:16] (+)= A[0:MR, 0:K] @ B[0:K, 0:16].
// A's element (i, k) is a[i * lda + k * ka], B's row k is b[k * ldb : k * ldb + 16], C's row i is c + i * ldc.
#ifndef MS_ATB_OPS_GEMM_TILE_H_
#define MS_ATB_OPS_GEMM_TILE_H_

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace ms_atb {

constexpr int64_t kTileCols = 16;
constexpr int64_t kTileRows = 6;  // 6 x 16 accumulators = 12 of the 16 ymm registers

template <int MR>
inline void GemmTile(const float *__restrict a, int64_t lda, int64_t ka, const float *__restrict b, int64_t ldb,
                     float *__restrict c, int64_t ldc, int64_t K, bool accumulate) {
  static_assert(MR >= 1 && MR <= kTileRows, "MR must lie in [1, 6]");
#if defined(__AVX2__) && defined(__FMA__)
  // Named accumulators (not an array) so that the compiler keeps all of them in registers.
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#define MS_ATB_LOAD(i)                                                        \
  if constexpr (MR > i) {                                                     \
    if (accumulate) {                                                         \
      c##i##0 = _mm256_loadu_ps(c + i * ldc);                                 \
      c##i##1 = _mm256_loadu_ps(c + i * ldc + 8);                             \
    }                                                                         \
  }
  MS_ATB_LOAD(0) MS_ATB_LOAD(1) MS_ATB_LOAD(2) MS_ATB_LOAD(3) MS_ATB_LOAD(4) MS_ATB_LOAD(5)
#undef MS_ATB_LOAD
  for (int64_t k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b + k * ldb), b1 = _mm256_loadu_ps(b + k * ldb + 8);
    __m256 x;
#define MS_ATB_ROW(i)                                                         \
  if constexpr (MR > i) {                                                     \
    x = _mm256_broadcast_ss(a + i * lda + k * ka);                            \
    c##i##0 = _mm256_fmadd_ps(x, b0, c##i##0);                                \
    c##i##1 = _mm256_fmadd_ps(x, b1, c##i##1);                                \
  }
    MS_ATB_ROW(0) MS_ATB_ROW(1) MS_ATB_ROW(2) MS_ATB_ROW(3) MS_ATB_ROW(4) MS_ATB_ROW(5)
#undef MS_ATB_ROW
  }
#define MS_ATB_STORE(i)                                                       \
  if constexpr (MR > i) {                                                     \
    _mm256_storeu_ps(c + i * ldc, c##i##0);                                   \
    _mm256_storeu_ps(c + i * ldc + 8, c##i##1);                               \
  }
  MS_ATB_STORE(0) MS_ATB_STORE(1) MS_ATB_STORE(2) MS_ATB_STORE(3) MS_ATB_STORE(4) MS_ATB_STORE(5)
#undef MS_ATB_STORE
#else
  // Portable path (no AVX2/FMA): the same loop order, left to the compiler's vectoriser.
  float acc[MR][kTileCols];
  for (int i = 0; i < MR; ++i)
    for (int64_t j = 0; j < kTileCols; ++j) acc[i][j] = accumulate ? c[i * ldc + j] : 0.0f;
  for (int64_t k = 0; k < K; ++k)
    for (int i = 0; i < MR; ++i) {
      const float x = a[i * lda + k * ka];
      for (int64_t j = 0; j < kTileCols; ++j) acc[i][j] += x * b[k * ldb + j];
    }
  for (int i = 0; i < MR; ++i) std::memcpy(c + i * ldc, acc[i], sizeof(acc[i]));
#endif
}

// GemmTile for m (1..6) rows chosen at run time.
inline void GemmRows(int64_t m, const float *a, int64_t lda, int64_t ka, const float *b, int64_t ldb, float *c,
                     int64_t ldc, int64_t K, bool accumulate) {
  switch (m) {
    case 6: GemmTile<6>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    case 5: GemmTile<5>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    case 4: GemmTile<4>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    case 3: GemmTile<3>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    case 2: GemmTile<2>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    case 1: GemmTile<1>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    default: break;
  }
}

}  // namespace ms_atb

#endif  // MS_ATB_OPS_GEMM_TILE_H_
