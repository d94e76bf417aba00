// ReshapeAndCache: writes this step's key/value rows into their cache slots, in place.
//   key, value [T, KVH, D]; key_cache, value_cache [NB, BS, KVH, D]; slot_mapping [T] int32
//   (slot = block * BS + offset; a negative slot is skipped) -> done [1] int32 (always 1).
// The rows (float32, float16, bfloat16) are converted to the caches' dtype as they are written.
// ReshapeAndCacheQuant writes int8 caches and takes two more inputs after slot_mapping:
// key_scale_cache, value_scale_cache [NB, BS, KVH] float32. Each (token, KV head) row of D values is
// quantised symmetrically on its own: scale = max|x| / 127, q = round_half_even(x * (127 / max|x|)),
// so the cached value is q * scale; an all-zero row stores q = 0 and scale 0.
// RopeAndCache (RopeAndCacheQuant: int8 caches and their scales, as above) fuses the attention's rotary
// embedding, its q/k/v split and this write: one op where there were seven.
//   qkv [T, (H + 2 KVH) D] float32 (q's H heads, then k's KVH, then v's KVH), cos [T, D], sin [T, D],
//   perm [D] int32, key_cache, value_cache [NB, BS, KVH, D], slot_mapping [T] int32 -> q [T, H D] float32:
//   q and k rotated as RotaryEmbedding does (ops/elementwise.cc), k and v written as above.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <vector>

#include "dtype.h"
#include "kernel_profile.h"
#include "rope_row.h"
#include "thread_pool.h"

namespace {

size_t ElementSize(ms_atb::DType t) {
  switch (t) {
    case ms_atb::DType::kFloat32: return 4;
    case ms_atb::DType::kFloat16:
    case ms_atb::DType::kBFloat16: return 2;
    case ms_atb::DType::kInt8: return 1;
    default: return 0;
  }
}

bool SameShape(const int64_t *a, const int64_t *b, int n) {
  for (int i = 0; i < n; ++i) if (a[i] != b[i]) return false;
  return true;
}

int Fail(const char *msg) {
  std::fprintf(stderr, "ms_atb ReshapeAndCache: %s\n", msg);
  return 1;
}

// One row of D values, converted.
template <typename S, typename C>
void WriteRow(const S *src, int64_t D, C *dst) {
  for (int64_t d = 0; d < D; ++d) dst[d] = ms_atb::FromFloat<C>(ms_atb::ToFloat(src[d]));
}

// One row of D values quantised to int8; returns its scale.
template <typename S>
float QuantizeRow(const S *src, int64_t D, int8_t *dst) {
  float amax = 0.0f;
  // A comparison, which skips a NaN as std::fmax does: GCC 12's AArch64 vectoriser fails (an internal compiler
  // error) on an fmax reduction.
  for (int64_t d = 0; d < D; ++d) {
    const float a = std::fabs(ms_atb::ToFloat(src[d]));
    amax = a > amax ? a : amax;
  }
  if (!(amax > 0.0f) || !std::isfinite(amax)) {  // zeros (or a non-finite row: stored as zeros)
    std::memset(dst, 0, D);
    return 0.0f;
  }
  const float inv = 127.0f / amax;
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) {
    const float q = std::nearbyint(ms_atb::ToFloat(src[d]) * inv);
    dst[d] = static_cast<int8_t>(std::fmin(127.0f, std::fmax(-127.0f, q)));
  }
  return amax / 127.0f;
}

// Rows of D values for (token t, KV head h) start at key + t * key_stride + h * D (value likewise).
template <typename S, typename C>
void Write(const S *key, int64_t key_stride, const S *value, int64_t value_stride, C *key_cache, C *value_cache,
           float *key_scales, float *value_scales, const int32_t *slots, int64_t T, int64_t KVH, int64_t D) {
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = slots[t];
    if (s < 0) continue;
    for (int64_t h = 0; h < KVH; ++h) {
      const S *k = key + t * key_stride + h * D, *v = value + t * value_stride + h * D;
      const int64_t dst = (s * KVH + h) * D;
      if constexpr (std::is_same<C, int8_t>::value) {
        key_scales[s * KVH + h] = QuantizeRow(k, D, key_cache + dst);
        value_scales[s * KVH + h] = QuantizeRow(v, D, value_cache + dst);
      } else {
        WriteRow(k, D, key_cache + dst);
        WriteRow(v, D, value_cache + dst);
      }
    }
  }
}

template <typename S>
int WriteFrom(ms_atb::DType cache, const void *key, int64_t key_stride, const void *value, int64_t value_stride,
              void *key_cache, void *value_cache, float *key_scales, float *value_scales, const int32_t *slots,
              int64_t T, int64_t KVH, int64_t D) {
  const S *k = static_cast<const S *>(key), *v = static_cast<const S *>(value);
  switch (cache) {
#define MS_ATB_WRITE(C)                                                                                   \
  Write<S, C>(k, key_stride, v, value_stride, static_cast<C *>(key_cache), static_cast<C *>(value_cache), \
              key_scales, value_scales, slots, T, KVH, D)
    case ms_atb::DType::kFloat32: MS_ATB_WRITE(float); return 0;
    case ms_atb::DType::kFloat16: MS_ATB_WRITE(ms_atb::Half); return 0;
    case ms_atb::DType::kBFloat16: MS_ATB_WRITE(ms_atb::BFloat16); return 0;
    case ms_atb::DType::kInt8: MS_ATB_WRITE(int8_t); return 0;
#undef MS_ATB_WRITE
    default: return Fail("caches must be float32, float16, bfloat16 or int8");
  }
}

// Writes T tokens' K and V rows (dtype dt, strides in elements) into the caches (dtype cache); the
// scales are those of int8 caches, null otherwise. Slots already checked against the cache's size.
int WriteRows(ms_atb::DType dt, ms_atb::DType cache, const void *key, int64_t key_stride, const void *value,
              int64_t value_stride, void *key_cache, void *value_cache, float *key_scales, float *value_scales,
              const int32_t *slots, int64_t T, int64_t KVH, int64_t D) {
  if (dt == cache) {  // same dtype: whole rows copied
    const size_t size = ElementSize(dt), row = static_cast<size_t>(KVH * D) * size;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t s = slots[t];
      if (s < 0) continue;
      std::memcpy(static_cast<char *>(key_cache) + s * row, static_cast<const char *>(key) + t * key_stride * size,
                  row);
      std::memcpy(static_cast<char *>(value_cache) + s * row,
                  static_cast<const char *>(value) + t * value_stride * size, row);
    }
    return 0;
  }
#define MS_ATB_WRITE_FROM(S) \
  WriteFrom<S>(cache, key, key_stride, value, value_stride, key_cache, value_cache, key_scales, value_scales, slots, T, KVH, D)
  if (dt == ms_atb::DType::kFloat32) return MS_ATB_WRITE_FROM(float);
  if (dt == ms_atb::DType::kFloat16) return MS_ATB_WRITE_FROM(ms_atb::Half);
  return MS_ATB_WRITE_FROM(ms_atb::BFloat16);
#undef MS_ATB_WRITE_FROM
}

// The scale caches of int8 caches (params[first], params[first + 1]), checked; false on a bad shape or dtype.
bool ScaleCaches(void **params, int *ndims, int64_t **shapes, const char **dtypes, int first, int64_t NB,
                 int64_t BS, int64_t KVH, float **key_scales, float **value_scales) {
  for (int i = first; i < first + 2; ++i)
    if (ndims[i] != 3 || shapes[i][0] != NB || shapes[i][1] != BS || shapes[i][2] != KVH ||
        ms_atb::ParseDType(dtypes[i]) != ms_atb::DType::kFloat32)
      return false;
  *key_scales = static_cast<float *>(params[first]);
  *value_scales = static_cast<float *>(params[first + 1]);
  return true;
}

bool SlotsInRange(const int32_t *slots, int64_t T, int64_t num_slots) {
  for (int64_t t = 0; t < T; ++t)
    if (slots[t] >= num_slots) return false;
  return true;
}

// Both entry points: `quant` takes key_scale_cache and value_scale_cache after slot_mapping.
int Cache(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, bool quant) {
  if (nparam != (quant ? 8 : 6)) return Fail(quant ? "expected 7 inputs and 1 output" : "expected 5 inputs and 1 output");
  if (ndims[0] != 3 || ndims[1] != 3 || ndims[2] != 4 || ndims[3] != 4 || ndims[4] != 1)
    return Fail("expected key/value [T, KVH, D], caches [NB, BS, KVH, D], slot_mapping [T]");
  const int64_t *ks = shapes[0], *cs = shapes[2];
  const int64_t T = ks[0], KVH = ks[1], D = ks[2], NB = cs[0], BS = cs[1];
  if (!SameShape(shapes[0], shapes[1], 3) || !SameShape(shapes[2], shapes[3], 4))
    return Fail("key and value (and key_cache and value_cache) must have the same shape");
  if (cs[2] != KVH || cs[3] != D) return Fail("cache [NB, BS, KVH, D] does not match key [T, KVH, D]");
  if (shapes[4][0] != T) return Fail("slot_mapping must have one entry per token");
  const ms_atb::DType dt = ms_atb::ParseDType(dtypes[0]), cache = ms_atb::ParseDType(dtypes[2]);
  if (ElementSize(dt) == 0 || dt == ms_atb::DType::kInt8) return Fail("key and value must be float32, float16 or bfloat16");
  if (ElementSize(cache) == 0) return Fail("caches must be float32, float16, bfloat16 or int8");
  if (ms_atb::ParseDType(dtypes[1]) != dt || ms_atb::ParseDType(dtypes[3]) != cache)
    return Fail("key and value (and key_cache and value_cache) must share one dtype");
  if ((cache == ms_atb::DType::kInt8) != quant)
    return Fail(quant ? "ReshapeAndCacheQuant writes int8 caches" : "int8 caches need their scales (ReshapeAndCacheQuant)");
  if (ms_atb::ParseDType(dtypes[4]) != ms_atb::DType::kInt32) return Fail("slot_mapping must be int32");
  float *key_scales = nullptr, *value_scales = nullptr;
  if (quant && !ScaleCaches(params, ndims, shapes, dtypes, 5, NB, BS, KVH, &key_scales, &value_scales))
    return Fail("key_scale_cache and value_scale_cache must be float32 [NB, BS, KVH]");
  const int32_t *slots = static_cast<const int32_t *>(params[4]);
  if (!SlotsInRange(slots, T, NB * BS)) return Fail("slot_mapping entry out of range");
  const int status = WriteRows(dt, cache, params[0], KVH * D, params[1], KVH * D, params[2], params[3], key_scales,
                               value_scales, slots, T, KVH, D);
  if (status != 0) return status;
  *static_cast<int32_t *>(params[nparam - 1]) = 1;
  return 0;
}

// Both entry points of the fused form: `quant` takes key_scale_cache and value_scale_cache after slot_mapping.
int RopeCache(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, bool quant) {
  if (nparam != (quant ? 10 : 8)) return Fail(quant ? "expected 9 inputs and 1 output" : "expected 7 inputs and 1 output");
  if (ndims[0] != 2 || ndims[1] != 2 || ndims[2] != 2 || ndims[3] != 1 || ndims[4] != 4 || ndims[5] != 4 ||
      ndims[6] != 1)
    return Fail("expected qkv [T, W], cos [T, D], sin [T, D], perm [D], caches [NB, BS, KVH, D], slot_mapping [T]");
  const int64_t *cs = shapes[4];
  const int64_t T = shapes[0][0], W = shapes[0][1], NB = cs[0], BS = cs[1], KVH = cs[2], D = cs[3];
  if (!SameShape(shapes[4], shapes[5], 4)) return Fail("key_cache and value_cache must have the same shape");
  if (D < 1 || KVH < 1 || W % D != 0 || W / D <= 2 * KVH)
    return Fail("qkv's width must be (H + 2 KVH) * D with H >= 1, for the caches' KVH and D");
  if (shapes[1][0] != T || shapes[1][1] != D || shapes[2][0] != T || shapes[2][1] != D || shapes[3][0] != D)
    return Fail("cos and sin must be [T, D] and perm [D]");
  if (shapes[6][0] != T) return Fail("slot_mapping must have one entry per token");
  for (int i = 0; i < 3; ++i)
    if (ms_atb::ParseDType(dtypes[i]) != ms_atb::DType::kFloat32) return Fail("qkv, cos and sin must be float32");
  if (ms_atb::ParseDType(dtypes[3]) != ms_atb::DType::kInt32 || ms_atb::ParseDType(dtypes[6]) != ms_atb::DType::kInt32)
    return Fail("perm and slot_mapping must be int32");
  const ms_atb::DType cache = ms_atb::ParseDType(dtypes[4]);
  if (ElementSize(cache) == 0 || ms_atb::ParseDType(dtypes[5]) != cache)
    return Fail("caches must share one dtype: float32, float16, bfloat16 or int8");
  if ((cache == ms_atb::DType::kInt8) != quant)
    return Fail(quant ? "RopeAndCacheQuant writes int8 caches" : "int8 caches need their scales (RopeAndCacheQuant)");
  if (ms_atb::ParseDType(dtypes[nparam - 1]) != ms_atb::DType::kFloat32) return Fail("q must be float32");
  float *key_scales = nullptr, *value_scales = nullptr;
  if (quant && !ScaleCaches(params, ndims, shapes, dtypes, 7, NB, BS, KVH, &key_scales, &value_scales))
    return Fail("key_scale_cache and value_scale_cache must be float32 [NB, BS, KVH]");
  const int32_t *perm = static_cast<const int32_t *>(params[3]);
  for (int64_t d = 0; d < D; ++d)
    if (perm[d] < 0 || perm[d] >= D) return Fail("perm entries must lie in [0, D)");
  const int32_t *slots = static_cast<const int32_t *>(params[6]);
  if (!SlotsInRange(slots, T, NB * BS)) return Fail("slot_mapping entry out of range");
  const float *qkv = static_cast<const float *>(params[0]);
  const float *cos = static_cast<const float *>(params[1]), *sin = static_cast<const float *>(params[2]);
  const int64_t H = W / D - 2 * KVH, kv = KVH * D;
  float *q = static_cast<float *>(params[nparam - 1]);
  std::vector<float> k(static_cast<size_t>(T * kv));  // [T, KVH D]: the rotated keys, before their write
  const int64_t per = std::max<int64_t>(1, 16384 / W), chunks = (T + per - 1) / per;
  ms_atb::ThreadPool::Get().Run(chunks, [&](int64_t c) {
    for (int64_t t = c * per; t < std::min(T, (c + 1) * per); ++t) {
      const float *x = qkv + t * W, *ct = cos + t * D, *st = sin + t * D;
      for (int64_t h = 0; h < H; ++h) ms_atb::RotateHead(x + h * D, ct, st, perm, D, q + (t * H + h) * D);
      for (int64_t h = 0; h < KVH; ++h) ms_atb::RotateHead(x + (H + h) * D, ct, st, perm, D, &k[t * kv + h * D]);
    }
  });
  return WriteRows(ms_atb::DType::kFloat32, cache, k.data(), kv, qkv + (H + KVH) * D, W, params[4], params[5],
                   key_scales, value_scales, slots, T, KVH, D);
}

}  // namespace

extern "C" std::vector<int64_t> RopeAndCacheInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {shapes[0][0], shapes[0][1] - 2 * shapes[4][2] * shapes[4][3]};
}

extern "C" std::vector<int64_t> RopeAndCacheQuantInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {shapes[0][0], shapes[0][1] - 2 * shapes[4][2] * shapes[4][3]};
}

extern "C" int RopeAndCache(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  ms_atb::KernelScope profile_scope("RopeAndCache");
  return RopeCache(nparam, params, ndims, shapes, dtypes, false);
}

extern "C" int RopeAndCacheQuant(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *stream, void *extra) {
  ms_atb::KernelScope profile_scope("RopeAndCache");
  return RopeCache(nparam, params, ndims, shapes, dtypes, true);
}

extern "C" std::vector<int64_t> ReshapeAndCacheInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {1};
}

extern "C" std::vector<int64_t> ReshapeAndCacheQuantInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {1};
}

extern "C" int ReshapeAndCache(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  ms_atb::KernelScope profile_scope("ReshapeAndCache");
  return Cache(nparam, params, ndims, shapes, dtypes, false);
}

extern "C" int ReshapeAndCacheQuant(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                    void *stream, void *extra) {
  ms_atb::KernelScope profile_scope("ReshapeAndCache");
  return Cache(nparam, params, ndims, shapes, dtypes, true);
}
