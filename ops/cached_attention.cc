// CachedAttention: a decoder layer's attention on the CPU as one op: RopeAndCache (ops/reshape_and_cache.cc:
// rotary embedding, q/k/v split, k and v written to the caches) then PagedAttention (ops/paged_attention.cc)
// of the rotated q over the caches.
//   qkv [T, (H + 2 KVH) D] float32, cos [T, D], sin [T, D], perm [D] int32, key_cache, value_cache
//   [NB, BS, KVH, D] (float32, float16, bfloat16), slot_mapping [T] int32, block_tables [B, MAXB] int32,
//   context_lens [B] int32, query_start_loc [B + 1] int32, scale [1] float32 -> out [T, H D] float32.
// CachedAttentionQuant: int8 caches, and key_scale_cache, value_scale_cache [NB, BS, KVH] float32 last.
// Each part checks its own arguments; the rows of out owned by no sequence are zero.
#include <cstdint>
#include <cstdio>
#include <vector>

extern "C" {
int RopeAndCache(int, void **, int *, int64_t **, const char **, void *, void *);
int RopeAndCacheQuant(int, void **, int *, int64_t **, const char **, void *, void *);
int PagedAttention(int, void **, int *, int64_t **, const char **, void *, void *);
int PagedAttentionQuant(int, void **, int *, int64_t **, const char **, void *, void *);
}

namespace {

int Fail(const char *msg) {
  std::fprintf(stderr, "ms_atb CachedAttention: %s\n", msg);
  return 1;
}

// One call's arguments, gathered from the op's.
struct Call {
  std::vector<void *> params;
  std::vector<int> ndims;
  std::vector<int64_t *> shapes;
  std::vector<const char *> dtypes;

  void Add(void *p, int ndim, int64_t *shape, const char *dtype) {
    params.push_back(p);
    ndims.push_back(ndim);
    shapes.push_back(shape);
    dtypes.push_back(dtype);
  }
  int Run(int (*fn)(int, void **, int *, int64_t **, const char **, void *, void *)) {
    return fn(static_cast<int>(params.size()), params.data(), ndims.data(), shapes.data(), dtypes.data(), nullptr,
              nullptr);
  }
};

int Attend(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, bool quant) {
  if (nparam != (quant ? 14 : 12)) return Fail(quant ? "expected 13 inputs and 1 output" : "expected 11 inputs and 1 output");
  if (ndims[0] != 2 || ndims[4] != 4 || ndims[nparam - 1] != 2)
    return Fail("expected qkv [T, W], caches [NB, BS, KVH, D] and out [T, H D]");
  const int64_t T = shapes[0][0], W = shapes[0][1], KVH = shapes[4][2], D = shapes[4][3];
  if (D < 1 || W % D != 0 || W / D <= 2 * KVH)
    return Fail("qkv's width must be (H + 2 KVH) * D with H >= 1, for the caches' KVH and D");
  int64_t q_shape[2] = {T, W - 2 * KVH * D};
  if (shapes[nparam - 1][0] != T || shapes[nparam - 1][1] != q_shape[1]) return Fail("out must be [T, H D]");
  std::vector<float> q(static_cast<size_t>(T * q_shape[1]));  // [T, H D]: the rotated queries
  Call rope;
  for (int i = 0; i < 7; ++i) rope.Add(params[i], ndims[i], shapes[i], dtypes[i]);
  if (quant)
    for (int i = 11; i < 13; ++i) rope.Add(params[i], ndims[i], shapes[i], dtypes[i]);
  rope.Add(q.data(), 2, q_shape, dtypes[nparam - 1]);
  const int status = rope.Run(quant ? RopeAndCacheQuant : RopeAndCache);
  if (status != 0) return status;
  Call attn;
  attn.Add(q.data(), 2, q_shape, dtypes[nparam - 1]);
  for (int i : {4, 5, 7, 8, 9, 10}) attn.Add(params[i], ndims[i], shapes[i], dtypes[i]);
  if (quant)
    for (int i = 11; i < 13; ++i) attn.Add(params[i], ndims[i], shapes[i], dtypes[i]);
  attn.Add(params[nparam - 1], ndims[nparam - 1], shapes[nparam - 1], dtypes[nparam - 1]);
  return attn.Run(quant ? PagedAttentionQuant : PagedAttention);
}

}  // namespace

extern "C" std::vector<int64_t> CachedAttentionInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {shapes[0][0], shapes[0][1] - 2 * shapes[4][2] * shapes[4][3]};
}

extern "C" std::vector<int64_t> CachedAttentionQuantInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {shapes[0][0], shapes[0][1] - 2 * shapes[4][2] * shapes[4][3]};
}

extern "C" int CachedAttention(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  return Attend(nparam, params, ndims, shapes, dtypes, false);
}

extern "C" int CachedAttentionQuant(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                    void *stream, void *extra) {
  return Attend(nparam, params, ndims, shapes, dtypes, true);
}
