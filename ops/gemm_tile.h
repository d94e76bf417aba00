// The register tile shared by the GEMM-shaped kernels: C[0:MR, 0:16] (+)= A[0:MR, 0:K] @ B[0:K, 0:16].
// A's element (i, k) is a[i * lda + k * ka], B's row k is b[k * ldb : k * ldb + 16], C's row i is c + i * ldc.
#ifndef MS_ATB_OPS_GEMM_TILE_H_
#define MS_ATB_OPS_GEMM_TILE_H_

#include <cstdint>
#include <cstring>

#if (defined(__AVX2__) && defined(__FMA__)) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace ms_atb {

constexpr int64_t kTileCols = 16;
#if defined(__AVX512F__)
constexpr int64_t kTileRows = 12;  // 12 rows of one zmm (16 floats) each: 12 of the 32 zmm registers
#else
constexpr int64_t kTileRows = 6;  // 6 rows of two ymm each: 12 of the 16 ymm registers
#endif

// The part of y = x[0:M] @ W that needs no product, for a y of M_total rows and N columns: the rows past the M
// valid ones are zero, and all of y when K is 0. Returns true when nothing is left to multiply.
inline bool ZeroWithoutProduct(int64_t M, int64_t M_total, int64_t K, int64_t N, float *y) {
  if (M_total == 0 || N == 0) return true;
  std::memset(y + M * N, 0, sizeof(float) * (M_total - M) * N);  // rows past the valid ones
  if (M == 0) return true;
  if (K == 0) {
    std::memset(y, 0, sizeof(float) * M * N);
    return true;
  }
  return false;
}

template <int MR>
inline void GemmTile(const float *__restrict a, int64_t lda, int64_t ka, const float *__restrict b, int64_t ldb,
                     float *__restrict c, int64_t ldc, int64_t K, bool accumulate) {
  static_assert(MR >= 1 && MR <= kTileRows, "MR must lie in [1, kTileRows]");
#if defined(__AVX512F__)
  // One zmm accumulator per row; A's element is broadcast straight from memory into the FMA.
  __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
  __m512 c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
#define MS_ATB_LOAD(i) \
  if constexpr (MR > i) { \
    if (accumulate) c##i = _mm512_loadu_ps(c + i * ldc); \
  }
  MS_ATB_LOAD(0) MS_ATB_LOAD(1) MS_ATB_LOAD(2) MS_ATB_LOAD(3) MS_ATB_LOAD(4) MS_ATB_LOAD(5)
  MS_ATB_LOAD(6) MS_ATB_LOAD(7) MS_ATB_LOAD(8) MS_ATB_LOAD(9) MS_ATB_LOAD(10) MS_ATB_LOAD(11)
#undef MS_ATB_LOAD
  for (int64_t k = 0; k < K; ++k) {
    const __m512 b0 = _mm512_loadu_ps(b + k * ldb);
#define MS_ATB_ROW(i) \
  if constexpr (MR > i) c##i = _mm512_fmadd_ps(_mm512_set1_ps(a[i * lda + k * ka]), b0, c##i);
    MS_ATB_ROW(0) MS_ATB_ROW(1) MS_ATB_ROW(2) MS_ATB_ROW(3) MS_ATB_ROW(4) MS_ATB_ROW(5)
    MS_ATB_ROW(6) MS_ATB_ROW(7) MS_ATB_ROW(8) MS_ATB_ROW(9) MS_ATB_ROW(10) MS_ATB_ROW(11)
#undef MS_ATB_ROW
  }
#define MS_ATB_STORE(i) \
  if constexpr (MR > i) _mm512_storeu_ps(c + i * ldc, c##i);
  MS_ATB_STORE(0) MS_ATB_STORE(1) MS_ATB_STORE(2) MS_ATB_STORE(3) MS_ATB_STORE(4) MS_ATB_STORE(5)
  MS_ATB_STORE(6) MS_ATB_STORE(7) MS_ATB_STORE(8) MS_ATB_STORE(9) MS_ATB_STORE(10) MS_ATB_STORE(11)
#undef MS_ATB_STORE
#elif defined(__AVX2__) && defined(__FMA__)
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
  // Portable path (no AVX2/FMA), left to the compiler's vectoriser: one row of C at a time, over all of k (each
  // C[i, j] sums its k in the same order as the paths above). Not k outer with the rows inside: GCC 12 then packs a
  // step's MR reads of A into vector loads that also read A up to three steps of k further, past the end of A
  // where ka is its row stride (PagedAttention's scores, ka = RP), which faults when A ends at a page.
  for (int i = 0; i < MR; ++i) {
    float acc[kTileCols];
    for (int64_t j = 0; j < kTileCols; ++j) acc[j] = accumulate ? c[i * ldc + j] : 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      const float x = a[i * lda + k * ka];
      for (int64_t j = 0; j < kTileCols; ++j) acc[j] += x * b[k * ldb + j];
    }
    std::memcpy(c + i * ldc, acc, sizeof(acc));
  }
#endif
}

#if defined(__AVX512F__)
// Two panels at once: C[0:MR, 0:16] = A @ B0 and C[0:MR, 16:32] = A @ B1, B1 = b + b1_offset: each
// broadcast of A feeds two FMAs (24 accumulators of the 32 zmm registers). A's rows are unit-stride;
// B's panels are packed (row k of B0 at b + 16 k). accumulate: C += A @ B.
template <int MR>
inline void GemmTile2(const float *__restrict a, int64_t lda, const float *__restrict b, int64_t b1_offset,
                      float *__restrict c, int64_t ldc, int64_t K, bool accumulate, const float *prefetch,
                      int64_t prefetch_every) {
  static_assert(MR >= 1 && MR <= kTileRows, "MR must lie in [1, kTileRows]");
  const float *__restrict b1 = b + b1_offset;
  __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
  __m512 c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
  __m512 d0 = c0, d1 = c0, d2 = c0, d3 = c0, d4 = c0, d5 = c0;
  __m512 d6 = c0, d7 = c0, d8 = c0, d9 = c0, d10 = c0, d11 = c0;
#define MS_ATB_LOAD(i) \
  if constexpr (MR > i) { \
    if (accumulate) { \
      c##i = _mm512_loadu_ps(c + i * ldc); \
      d##i = _mm512_loadu_ps(c + i * ldc + kTileCols); \
    } \
  }
  MS_ATB_LOAD(0) MS_ATB_LOAD(1) MS_ATB_LOAD(2) MS_ATB_LOAD(3) MS_ATB_LOAD(4) MS_ATB_LOAD(5)
  MS_ATB_LOAD(6) MS_ATB_LOAD(7) MS_ATB_LOAD(8) MS_ATB_LOAD(9) MS_ATB_LOAD(10) MS_ATB_LOAD(11)
#undef MS_ATB_LOAD
  int64_t countdown = 1;  // steps of k to the next prefetch
  for (int64_t k = 0; k < K; ++k) {
    if (prefetch != nullptr && --countdown == 0) {  // into L2: a cache line of each panel
      _mm_prefetch(reinterpret_cast<const char *>(prefetch), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char *>(prefetch + b1_offset), _MM_HINT_T1);
      prefetch += kTileCols;
      countdown = prefetch_every;
    }
    const __m512 b0v = _mm512_loadu_ps(b + k * kTileCols), b1v = _mm512_loadu_ps(b1 + k * kTileCols);
    __m512 x;
#define MS_ATB_ROW(i) \
  if constexpr (MR > i) { \
    x = _mm512_set1_ps(a[i * lda + k]); \
    c##i = _mm512_fmadd_ps(x, b0v, c##i); \
    d##i = _mm512_fmadd_ps(x, b1v, d##i); \
  }
    MS_ATB_ROW(0) MS_ATB_ROW(1) MS_ATB_ROW(2) MS_ATB_ROW(3) MS_ATB_ROW(4) MS_ATB_ROW(5)
    MS_ATB_ROW(6) MS_ATB_ROW(7) MS_ATB_ROW(8) MS_ATB_ROW(9) MS_ATB_ROW(10) MS_ATB_ROW(11)
#undef MS_ATB_ROW
  }
#define MS_ATB_STORE(i) \
  if constexpr (MR > i) { \
    _mm512_storeu_ps(c + i * ldc, c##i); \
    _mm512_storeu_ps(c + i * ldc + kTileCols, d##i); \
  }
  MS_ATB_STORE(0) MS_ATB_STORE(1) MS_ATB_STORE(2) MS_ATB_STORE(3) MS_ATB_STORE(4) MS_ATB_STORE(5)
  MS_ATB_STORE(6) MS_ATB_STORE(7) MS_ATB_STORE(8) MS_ATB_STORE(9) MS_ATB_STORE(10) MS_ATB_STORE(11)
#undef MS_ATB_STORE
}

// GemmTile2 for m (1..kTileRows) rows chosen at run time. prefetch (or nullptr): panel rows to pull
// into L2 while this tile is multiplied, one row (a cache line of each panel, same layout as b) every
// prefetch_every steps of k, so that several tiles can share the prefetching of one panel pair.
inline void GemmRows2(int64_t m, const float *a, int64_t lda, const float *b, int64_t b1_offset, float *c,
                      int64_t ldc, int64_t K, bool accumulate = false, const float *prefetch = nullptr,
                      int64_t prefetch_every = 1) {
  switch (m) {
    case 12: GemmTile2<12>(a, lda, b, b1_offset, c, ldc, K, accumulate, prefetch, prefetch_every); break;
    case 11: GemmTile2<11>(a, lda, b, b1_offset, c, ldc, K, accumulate, prefetch, prefetch_every); break;
    case 10: GemmTile2<10>(a, lda, b, b1_offset, c, ldc, K, accumulate, prefetch, prefetch_every); break;
    case 9: GemmTile2<9>(a, lda, b, b1_offset, c, ldc, K, accumulate, prefetch, prefetch_every); break;
    case 8: GemmTile2<8>(a, lda, b, b1_offset, c, ldc, K, accumulate, prefetch, prefetch_every); break;
    case 7: GemmTile2<7>(a, lda, b, b1_offset, c, ldc, K, accumulate, prefetch, prefetch_every); break;
    case 6: GemmTile2<6>(a, lda, b, b1_offset, c, ldc, K, accumulate, prefetch, prefetch_every); break;
    case 5: GemmTile2<5>(a, lda, b, b1_offset, c, ldc, K, accumulate, prefetch, prefetch_every); break;
    case 4: GemmTile2<4>(a, lda, b, b1_offset, c, ldc, K, accumulate, prefetch, prefetch_every); break;
    case 3: GemmTile2<3>(a, lda, b, b1_offset, c, ldc, K, accumulate, prefetch, prefetch_every); break;
    case 2: GemmTile2<2>(a, lda, b, b1_offset, c, ldc, K, accumulate, prefetch, prefetch_every); break;
    case 1: GemmTile2<1>(a, lda, b, b1_offset, c, ldc, K, accumulate, prefetch, prefetch_every); break;
    default: break;
  }
}
#endif

// GemmTile for m (1..kTileRows) rows chosen at run time.
inline void GemmRows(int64_t m, const float *a, int64_t lda, int64_t ka, const float *b, int64_t ldb, float *c,
                     int64_t ldc, int64_t K, bool accumulate) {
  switch (m) {
#if defined(__AVX512F__)
    case 12: GemmTile<12>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    case 11: GemmTile<11>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    case 10: GemmTile<10>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    case 9: GemmTile<9>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    case 8: GemmTile<8>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    case 7: GemmTile<7>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
#endif
    case 6: GemmTile<6>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    case 5: GemmTile<5>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    case 4: GemmTile<4>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    case 3: GemmTile<3>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    case 2: GemmTile<2>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    case 1: GemmTile<1>(a, lda, ka, b, ldb, c, ldc, K, accumulate); break;
    default: break;
  }
}

// C[0:M, 0:16 np] (+)= A[0:M, 0:K] @ B, A's rows unit-stride, B packed as np panels [K, 16], panel p
// at b + p * panel_stride: row tiles of kTileRows, panel pairs where the CPU has AVX-512.
inline void PanelProduct(int64_t M, const float *a, int64_t lda, const float *b, int64_t panel_stride, int64_t np,
                         int64_t K, float *c, int64_t ldc, bool accumulate) {
  for (int64_t r0 = 0; r0 < M; r0 += kTileRows) {
    const int64_t m = M - r0 < kTileRows ? M - r0 : kTileRows;
    int64_t p = 0;
#if defined(__AVX512F__)
    for (; p + 1 < np; p += 2)
      GemmRows2(m, a + r0 * lda, lda, b + p * panel_stride, panel_stride, c + r0 * ldc + p * kTileCols, ldc, K,
                accumulate);
#endif
    for (; p < np; ++p)
      GemmRows(m, a + r0 * lda, lda, 1, b + p * panel_stride, kTileCols, c + r0 * ldc + p * kTileCols, ldc, K,
               accumulate);
  }
}

}  // namespace ms_atb

#endif  // MS_ATB_OPS_GEMM_TILE_H_
