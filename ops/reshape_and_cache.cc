// ReshapeAndCache: writes this step's key/value rows into their cache slots, in place.
//   key, value [T, KVH, D]; key_cache, value_cache [NB, BS, KVH, D]; slot_mapping [T] int32
//   (slot = block * BS + offset; a negative slot is skipped) -> done [1] int32 (always 1).
// The rows (float32, float16, bfloat16) are converted to the caches' dtype as they are written.
// ReshapeAndCacheQuant writes int8 caches and takes two more inputs after slot_mapping:
// key_scale_cache, value_scale_cache [NB, BS, KVH] float32. Each (token, KV head) row of D values is
// quantised symmetrically on its own: scale = max|x| / 127, q = round_half_even(x * (127 / max|x|)),
// so the cached value is q * scale; an all-zero row stores q = 0 and scale 0.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <vector>

#include "dtype.h"
#include "kernel_profile.h"

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
  for (int64_t d = 0; d < D; ++d) amax = std::fmax(amax, std::fabs(ms_atb::ToFloat(src[d])));
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

template <typename S, typename C>
void Write(const S *key, const S *value, C *key_cache, C *value_cache, float *key_scales, float *value_scales,
           const int32_t *slots, int64_t T, int64_t KVH, int64_t D) {
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = slots[t];
    if (s < 0) continue;
    for (int64_t h = 0; h < KVH; ++h) {
      const int64_t src = (t * KVH + h) * D, dst = (s * KVH + h) * D;
      if constexpr (std::is_same<C, int8_t>::value) {
        key_scales[s * KVH + h] = QuantizeRow(key + src, D, key_cache + dst);
        value_scales[s * KVH + h] = QuantizeRow(value + src, D, value_cache + dst);
      } else {
        WriteRow(key + src, D, key_cache + dst);
        WriteRow(value + src, D, value_cache + dst);
      }
    }
  }
}

template <typename S>
int WriteFrom(ms_atb::DType cache, void **params, const int32_t *slots, int64_t T, int64_t KVH, int64_t D,
              float *key_scales, float *value_scales) {
  const S *k = static_cast<const S *>(params[0]), *v = static_cast<const S *>(params[1]);
  switch (cache) {
#define MS_ATB_WRITE(C) \
  Write<S, C>(k, v, static_cast<C *>(params[2]), static_cast<C *>(params[3]), key_scales, value_scales, slots, T, KVH, D)
    case ms_atb::DType::kFloat32: MS_ATB_WRITE(float); return 0;
    case ms_atb::DType::kFloat16: MS_ATB_WRITE(ms_atb::Half); return 0;
    case ms_atb::DType::kBFloat16: MS_ATB_WRITE(ms_atb::BFloat16); return 0;
    case ms_atb::DType::kInt8: MS_ATB_WRITE(int8_t); return 0;
#undef MS_ATB_WRITE
    default: return Fail("caches must be float32, float16, bfloat16 or int8");
  }
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
  if (quant) {
    for (int i = 5; i < 7; ++i)
      if (ndims[i] != 3 || shapes[i][0] != NB || shapes[i][1] != BS || shapes[i][2] != KVH ||
          ms_atb::ParseDType(dtypes[i]) != ms_atb::DType::kFloat32)
        return Fail("key_scale_cache and value_scale_cache must be float32 [NB, BS, KVH]");
    key_scales = static_cast<float *>(params[5]);
    value_scales = static_cast<float *>(params[6]);
  }
  const int32_t *slots = static_cast<const int32_t *>(params[4]);
  const int64_t num_slots = NB * BS;
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] >= num_slots) return Fail("slot_mapping entry out of range");
  }
  int status = 0;
  if (dt == cache) {  // same dtype: whole rows copied
    const size_t row = static_cast<size_t>(KVH * D) * ElementSize(dt);
    const char *key = static_cast<const char *>(params[0]), *value = static_cast<const char *>(params[1]);
    char *key_cache = static_cast<char *>(params[2]), *value_cache = static_cast<char *>(params[3]);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t s = slots[t];
      if (s < 0) continue;
      std::memcpy(key_cache + s * row, key + t * row, row);
      std::memcpy(value_cache + s * row, value + t * row, row);
    }
  } else if (dt == ms_atb::DType::kFloat32) {
    status = WriteFrom<float>(cache, params, slots, T, KVH, D, key_scales, value_scales);
  } else if (dt == ms_atb::DType::kFloat16) {
    status = WriteFrom<ms_atb::Half>(cache, params, slots, T, KVH, D, key_scales, value_scales);
  } else {
    status = WriteFrom<ms_atb::BFloat16>(cache, params, slots, T, KVH, D, key_scales, value_scales);
  }
  if (status != 0) return status;
  *static_cast<int32_t *>(params[nparam - 1]) = 1;
  return 0;
}

}  // namespace

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
