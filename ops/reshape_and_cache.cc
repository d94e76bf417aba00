// ReshapeAndCache: writes this step's key/value rows into their cache slots, in place.
//   key, value [T, KVH, D]; key_cache, value_cache [NB, BS, KVH, D]; slot_mapping [T] int32
//   (slot = block * BS + offset; a negative slot is skipped) -> done [1] int32 (always 1).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "dtype.h"
#include "kernel_profile.h"

namespace {

size_t ElementSize(ms_atb::DType t) {
  switch (t) {
    case ms_atb::DType::kFloat32: return 4;
    case ms_atb::DType::kFloat16:
    case ms_atb::DType::kBFloat16: return 2;
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

}  // namespace

extern "C" std::vector<int64_t> ReshapeAndCacheInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {1};
}

extern "C" int ReshapeAndCache(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  ms_atb::KernelScope profile_scope("ReshapeAndCache");
  if (nparam != 6) return Fail("expected 5 inputs and 1 output");
  if (ndims[0] != 3 || ndims[1] != 3 || ndims[2] != 4 || ndims[3] != 4 || ndims[4] != 1)
    return Fail("expected key/value [T, KVH, D], caches [NB, BS, KVH, D], slot_mapping [T]");
  const int64_t *ks = shapes[0], *cs = shapes[2];
  const int64_t T = ks[0], KVH = ks[1], D = ks[2], NB = cs[0], BS = cs[1];
  if (!SameShape(shapes[0], shapes[1], 3) || !SameShape(shapes[2], shapes[3], 4))
    return Fail("key and value (and key_cache and value_cache) must have the same shape");
  if (cs[2] != KVH || cs[3] != D) return Fail("cache [NB, BS, KVH, D] does not match key [T, KVH, D]");
  if (shapes[4][0] != T) return Fail("slot_mapping must have one entry per token");
  ms_atb::DType dt = ms_atb::ParseDType(dtypes[0]);
  size_t esize = ElementSize(dt);
  if (esize == 0) return Fail("dtype must be float32, float16 or bfloat16");
  for (int i = 1; i < 4; ++i)
    if (ms_atb::ParseDType(dtypes[i]) != dt) return Fail("key, value and both caches must share one dtype");
  if (ms_atb::ParseDType(dtypes[4]) != ms_atb::DType::kInt32) return Fail("slot_mapping must be int32");

  const char *key = static_cast<const char *>(params[0]);
  const char *value = static_cast<const char *>(params[1]);
  char *key_cache = static_cast<char *>(params[2]);
  char *value_cache = static_cast<char *>(params[3]);
  const int32_t *slots = static_cast<const int32_t *>(params[4]);
  const int64_t num_slots = NB * BS;
  const size_t row = static_cast<size_t>(KVH * D) * esize;
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] >= num_slots) return Fail("slot_mapping entry out of range");
  }
  for (int64_t t = 0; t < T; ++t) {
    int64_t s = slots[t];
    if (s < 0) continue;
    std::memcpy(key_cache + s * row, key + t * row, row);
    std::memcpy(value_cache + s * row, value + t * row, row);
  }
  *static_cast<int32_t *>(params[5]) = 1;
  return 0;
}
