// The elementwise parts of a decoder layer as single kernels: on the CPU each MindSpore op costs
// ~25 us of dispatch whatever its size, and RMSNorm alone is 8 of them. float32 only.
//   RmsNorm(x [T, H], weight [H], eps [1]) -> [T, H]: x * rsqrt(mean(x^2) + eps) * weight
//   AddRmsNorm(x [T, H], residual [T, H], weight [H], eps [1]) -> (h [T, H], RmsNorm(h) [T, H]),
//     h = x + residual: a residual add and the next norm in one kernel
//   LastTokenNorm(x [T, H], residual [T, H], query_start_loc [B + 1] int32, weight [H], eps [1])
//     -> (y [B, H], seqs [1] int32): y[b] = RmsNorm(x + residual) of row max(query_start_loc[b + 1] - 1, 0),
//     each sequence's last token; seqs counts the sequences that own a token (query_start_loc rises)
//   RotaryEmbedding(qkv [T, W], cos [T, D], sin [T, D], perm [D] int32, rotated_heads [1] int32)
//     -> [T, W]: the first rotated_heads heads of D columns become x * cos + x[perm] * sin (perm and the
//     signs folded into sin encode rotate-half or interleaved pairs), the other columns are copied
//   SwiGlu(gate_up [T, 2I]) -> [T, I]: silu(gate) * up, gate the first I columns
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "dtype.h"
#include "kernel_profile.h"
#include "fast_math.h"
#include "rope_row.h"
#include "thread_pool.h"

namespace {

int Fail(const char *op, const char *msg) {
  std::fprintf(stderr, "ms_atb %s: %s\n", op, msg);
  return 1;
}

bool AllFloat32(const char **dtypes, int n) {
  for (int i = 0; i < n; ++i)
    if (ms_atb::ParseDType(dtypes[i]) != ms_atb::DType::kFloat32) return false;
  return true;
}

// Calls fn(row_begin, row_end) over [0, rows) in chunks of about 16k elements, on the thread pool
// when there is more than one chunk.
template <typename Fn>
void ForRows(int64_t rows, int64_t width, const Fn &fn) {
  const int64_t per = std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1));
  const int64_t chunks = (rows + per - 1) / per;
  ms_atb::ThreadPool::Get().Run(chunks, [&](int64_t c) { fn(c * per, std::min(rows, (c + 1) * per)); });
}

// y = x * rsqrt(mean(x^2) + eps) * w over one row of H values.
inline void NormRow(const float *x, const float *w, float eps, int64_t H, float *y) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < H; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
#pragma omp simd
  for (int64_t i = 0; i < H; ++i) y[i] = x[i] * inv * w[i];
}

}  // namespace

extern "C" std::vector<int64_t> RmsNormInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {shapes[0][0], shapes[0][1]};
}

extern "C" int RmsNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                       void *stream, void *extra) {
  ms_atb::KernelScope profile_scope("RmsNorm");
  if (nparam != 4) return Fail("RmsNorm", "expected 3 inputs and 1 output");
  if (ndims[0] != 2 || ndims[1] != 1 || shapes[1][0] != shapes[0][1] || shapes[2][0] != 1)
    return Fail("RmsNorm", "expected x [T, H], weight [H], eps [1]");
  if (!AllFloat32(dtypes, 4)) return Fail("RmsNorm", "dtype must be float32");
  const int64_t T = shapes[0][0], H = shapes[0][1];
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  const float eps = *static_cast<const float *>(params[2]);
  float *y = static_cast<float *>(params[3]);
  ForRows(T, H, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) NormRow(x + r * H, w, eps, H, y + r * H);
  });
  return 0;
}

extern "C" int AddRmsNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                          void *stream, void *extra) {
  ms_atb::KernelScope profile_scope("AddRmsNorm");
  const char *op = "AddRmsNorm";
  if (nparam != 6) return Fail(op, "expected 4 inputs and 2 outputs");
  if (ndims[0] != 2 || ndims[1] != 2 || ndims[2] != 1 || shapes[1][0] != shapes[0][0] ||
      shapes[1][1] != shapes[0][1] || shapes[2][0] != shapes[0][1] || shapes[3][0] != 1)
    return Fail(op, "expected x [T, H], residual [T, H], weight [H], eps [1]");
  if (!AllFloat32(dtypes, 6)) return Fail(op, "dtype must be float32");
  const int64_t T = shapes[0][0], H = shapes[0][1];
  const float *x = static_cast<const float *>(params[0]);
  const float *res = static_cast<const float *>(params[1]);
  const float *w = static_cast<const float *>(params[2]);
  const float eps = *static_cast<const float *>(params[3]);
  float *h = static_cast<float *>(params[4]);
  float *y = static_cast<float *>(params[5]);
  ForRows(T, H, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float *hr = h + r * H;
      const float *xr = x + r * H, *rr = res + r * H;
#pragma omp simd
      for (int64_t i = 0; i < H; ++i) hr[i] = xr[i] + rr[i];
      NormRow(hr, w, eps, H, y + r * H);
    }
  });
  return 0;
}

extern "C" int LastTokenNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                             void *stream, void *extra) {
  ms_atb::KernelScope profile_scope("LastTokenNorm");
  const char *op = "LastTokenNorm";
  if (nparam != 7) return Fail(op, "expected 5 inputs and 2 outputs");
  if (ndims[0] != 2 || ndims[1] != 2 || ndims[2] != 1 || ndims[3] != 1 || shapes[1][0] != shapes[0][0] ||
      shapes[1][1] != shapes[0][1] || shapes[3][0] != shapes[0][1] || shapes[4][0] != 1 || shapes[2][0] < 1)
    return Fail(op, "expected x [T, H], residual [T, H], query_start_loc [B + 1], weight [H], eps [1]");
  const int64_t T = shapes[0][0], H = shapes[0][1], B = shapes[2][0] - 1;
  if (ndims[5] != 2 || shapes[5][0] != B || shapes[5][1] != H || ndims[6] != 1 || shapes[6][0] != 1)
    return Fail(op, "outputs must be y [B, H] and seqs [1]");
  if (!AllFloat32(dtypes, 2) || !AllFloat32(dtypes + 3, 3) ||
      ms_atb::ParseDType(dtypes[2]) != ms_atb::DType::kInt32 || ms_atb::ParseDType(dtypes[6]) != ms_atb::DType::kInt32)
    return Fail(op, "x, residual, weight, eps and y must be float32; query_start_loc and seqs int32");
  const float *x = static_cast<const float *>(params[0]);
  const float *res = static_cast<const float *>(params[1]);
  const int32_t *qsl = static_cast<const int32_t *>(params[2]);
  const float *w = static_cast<const float *>(params[3]);
  const float eps = *static_cast<const float *>(params[4]);
  float *y = static_cast<float *>(params[5]);
  for (int64_t b = 0; b <= B; ++b)
    if (qsl[b] < 0 || qsl[b] > T) return Fail(op, "query_start_loc entries must lie in [0, T]");
  std::vector<float> h(static_cast<size_t>(H));
  int32_t seqs = 0;
  for (int64_t b = 0; b < B; ++b) {
    seqs += qsl[b + 1] > qsl[b];
    const int64_t row = std::max<int64_t>(qsl[b + 1] - 1, 0);
    const float *xr = x + row * H, *rr = res + row * H;
#pragma omp simd
    for (int64_t i = 0; i < H; ++i) h[i] = xr[i] + rr[i];
    NormRow(h.data(), w, eps, H, y + b * H);
  }
  *static_cast<int32_t *>(params[6]) = seqs;
  return 0;
}

extern "C" std::vector<int64_t> RotaryEmbeddingInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {shapes[0][0], shapes[0][1]};
}

extern "C" int RotaryEmbedding(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  ms_atb::KernelScope profile_scope("RotaryEmbedding");
  const char *op = "RotaryEmbedding";
  if (nparam != 6) return Fail(op, "expected 5 inputs and 1 output");
  if (ndims[0] != 2 || ndims[1] != 2 || ndims[2] != 2 || ndims[3] != 1 || shapes[4][0] != 1)
    return Fail(op, "expected qkv [T, W], cos [T, D], sin [T, D], perm [D], rotated_heads [1]");
  const int64_t T = shapes[0][0], W = shapes[0][1], D = shapes[1][1];
  if (shapes[1][0] != T || shapes[2][0] != T || shapes[2][1] != D || shapes[3][0] != D)
    return Fail(op, "cos and sin must be [T, D] and perm [D]");
  if (!AllFloat32(dtypes, 3) || ms_atb::ParseDType(dtypes[5]) != ms_atb::DType::kFloat32 ||
      ms_atb::ParseDType(dtypes[3]) != ms_atb::DType::kInt32 || ms_atb::ParseDType(dtypes[4]) != ms_atb::DType::kInt32)
    return Fail(op, "qkv, cos, sin must be float32; perm and rotated_heads int32");
  const float *x = static_cast<const float *>(params[0]);
  const float *cos = static_cast<const float *>(params[1]);
  const float *sin = static_cast<const float *>(params[2]);
  const int32_t *perm = static_cast<const int32_t *>(params[3]);
  const int64_t heads = *static_cast<const int32_t *>(params[4]);
  float *y = static_cast<float *>(params[5]);
  if (heads < 0 || heads * D > W) return Fail(op, "rotated_heads * D exceeds the row width");
  for (int64_t d = 0; d < D; ++d)
    if (perm[d] < 0 || perm[d] >= D) return Fail(op, "perm entries must lie in [0, D)");
  ForRows(T, W, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *xr = x + r * W, *c = cos + r * D, *s = sin + r * D;
      float *yr = y + r * W;
      for (int64_t h = 0; h < heads; ++h) ms_atb::RotateHead(xr + h * D, c, s, perm, D, yr + h * D);
      std::memcpy(yr + heads * D, xr + heads * D, sizeof(float) * (W - heads * D));
    }
  });
  return 0;
}

extern "C" std::vector<int64_t> SwiGluInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {shapes[0][0], shapes[0][1] / 2};
}

extern "C" int SwiGlu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra) {
  ms_atb::KernelScope profile_scope("SwiGlu");
  if (nparam != 2) return Fail("SwiGlu", "expected 1 input and 1 output");
  if (ndims[0] != 2 || shapes[0][1] % 2 != 0) return Fail("SwiGlu", "expected gate_up [T, 2I]");
  if (!AllFloat32(dtypes, 2)) return Fail("SwiGlu", "dtype must be float32");
  const int64_t T = shapes[0][0], I = shapes[0][1] / 2;
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  ForRows(T, I, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *g = x + r * 2 * I, *u = g + I;
      float *yr = y + r * I;
#pragma omp simd
      for (int64_t i = 0; i < I; ++i) yr[i] = ms_atb::Silu(g[i]) * u[i];
    }
  });
  return 0;
}
