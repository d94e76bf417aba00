// The AscendC kernels of ops/ascendc/op_kernel behind mindspore.ops.Custom aot on the CPU: argument
// checks at the C boundary, the tiling of op_host/ms_atb_plan.h for the assumed Atlas 800I A2
// figures, then every core of the launch run by the CPU implementation of the API subset.
// Also exports the tiling plans for ms_atb.ops.functional.ascendc_tiling (ctypes).
#include <cstdio>
#include <cstring>
#include <vector>

#include "ms_atb_paged_attention_tiling.h"
#include "ms_atb_plan.h"
#include "ms_atb_reshape_and_cache_tiling.h"
#include "sim_runner.h"

extern "C" void ms_atb_paged_attention(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR,
                                       GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR);
extern "C" void ms_atb_reshape_and_cache(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR,
                                         GM_ADDR, GM_ADDR);

namespace {

int Fail(const char *op, const std::string &msg) {
  AscendC::LastError() = std::string(op) + ": " + msg;
  std::fprintf(stderr, "ms_atb ascendc %s: %s\n", op, msg.c_str());
  return 1;
}

// Tiling key of the kernels: 0 float16, 1 bfloat16, -1 anything else.
int TilingKey(const char *dtype) {
  if (std::strcmp(dtype, "float16") == 0) return 0;
  if (std::strcmp(dtype, "bfloat16") == 0) return 1;
  return -1;
}

AscendC::CoreCapacity Capacity(const ms_atb_plan::HardwareFigures &hw) {
  AscendC::CoreCapacity c;
  c.ub = hw.ub_bytes; c.l1 = hw.l1_bytes; c.l0a = hw.l0a_bytes; c.l0b = hw.l0b_bytes; c.l0c = hw.l0c_bytes;
  return c;
}

uint64_t Elements(const int64_t *shape, int ndim) {
  uint64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= static_cast<uint64_t>(shape[i]);
  return n;
}

}  // namespace

extern "C" std::vector<int64_t> MsAtbPagedAttentionInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {shapes[0][0], shapes[0][1], shapes[0][2]};
}

extern "C" std::vector<int64_t> MsAtbReshapeAndCacheInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {1};
}

extern "C" std::vector<int64_t> MsAtbPagedAttentionQuantInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {shapes[0][0], shapes[0][1], shapes[0][2]};
}

extern "C" std::vector<int64_t> MsAtbReshapeAndCacheQuantInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {1};
}

namespace {

// Both forms of each op: `quant` takes int8 caches and key_scale_cache, value_scale_cache [NB, BS, KVH]
// float32 (after scale for paged attention, after slot_mapping for reshape_and_cache).
int PagedAttention(bool quant, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  const char *op = quant ? "MsAtbPagedAttentionQuant" : "MsAtbPagedAttention";
  const int out = quant ? 9 : 7;
  if (nparam != out + 1) return Fail(op, quant ? "expected 9 inputs and 1 output" : "expected 7 inputs and 1 output");
  if (ndims[0] != 3 || ndims[1] != 4 || ndims[2] != 4 || ndims[3] != 2 || ndims[4] != 1 || ndims[5] != 1 ||
      ndims[6] != 1)
    return Fail(op, "expected query [T, H, D], caches [NB, BS, KVH, D], block_tables [B, MAXB], context_lens [B], "
                    "query_start_loc [B + 1], scale [1]");
  const int key = TilingKey(dtypes[0]);
  if (key < 0) return Fail(op, "query must be float16 or bfloat16");
  const char *cache = quant ? "int8" : dtypes[0];
  for (int i = 1; i < 3; ++i)
    if (std::strcmp(dtypes[i], cache) != 0)
      return Fail(op, quant ? "the caches must be int8" : "query and caches must share one dtype");
  for (int i = 3; i < 6; ++i)
    if (std::strcmp(dtypes[i], "int32") != 0) return Fail(op, "index inputs must be int32");
  if (std::strcmp(dtypes[6], "float32") != 0 || shapes[6][0] != 1) return Fail(op, "scale must be float32 [1]");
  for (int i = 0; i < 4; ++i)
    if (shapes[1][i] != shapes[2][i]) return Fail(op, "key_cache and value_cache must have the same shape");
  for (int i = 7; quant && i < 9; ++i)
    if (std::strcmp(dtypes[i], "float32") != 0 || ndims[i] != 3 || shapes[i][0] != shapes[1][0] ||
        shapes[i][1] != shapes[1][1] || shapes[i][2] != shapes[1][2])
      return Fail(op, "key_scale_cache and value_scale_cache must be float32 [NB, BS, KVH]");
  const int64_t T = shapes[0][0], B = shapes[3][0], MAXB = shapes[3][1], NB = shapes[1][0], BS = shapes[1][1];
  if (shapes[1][3] != shapes[0][2]) return Fail(op, "the caches' head_dim differs from the query's");
  if (shapes[4][0] != B || shapes[5][0] != B + 1) return Fail(op, "need context_lens [B] and query_start_loc [B + 1]");
  const auto *tables = static_cast<const int32_t *>(params[3]);
  const auto *lens = static_cast<const int32_t *>(params[4]);
  const auto *starts = static_cast<const int32_t *>(params[5]);
  if (starts[0] < 0 || starts[B] > T) return Fail(op, "query_start_loc out of [0, T]");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t nq = starts[b + 1] - starts[b];
    if (nq < 0) return Fail(op, "query_start_loc must be non-decreasing");
    if (nq == 0) continue;
    if (lens[b] < nq) return Fail(op, "context_lens[b] must be >= the sequence's query count");
    if ((lens[b] + BS - 1) / BS > MAXB) return Fail(op, "context_lens[b] needs more blocks than block_tables has");
    for (int64_t j = 0; j < (lens[b] + BS - 1) / BS; ++j)
      if (tables[b * MAXB + j] < 0 || tables[b * MAXB + j] >= NB) return Fail(op, "block_tables entry out of range");
  }
  const ms_atb_plan::HardwareFigures hw = ms_atb_plan::AssumedAtlas800IA2();
  const ms_atb_plan::PagedAttentionShape shape{T, shapes[0][1], shapes[1][2], shapes[0][2], BS, NB, B, MAXB, 2,
                                               quant ? 1 : 2};
  const char *why;
  const ms_atb_plan::PagedAttentionPlan plan = ms_atb_plan::PlanPagedAttention(shape, hw, &why);
  if (plan.ub_bytes == 0) return Fail(op, std::string("no tiling: ") + why);
  optiling::MsAtbPagedAttentionTilingData td;
  ms_atb_plan::StorePagedAttention(shape, plan, td);
  // The workspace starts unwritten: NaN in every float type, so reading what no core wrote shows.
  std::vector<uint8_t> workspace(plan.workspace_bytes, 0xff);
  std::vector<AscendC::GmTensor> gm;
  for (int i = 0; i <= out; ++i)
    gm.push_back({params[i], Elements(shapes[i], ndims[i]) * (i == 1 || i == 2 ? (quant ? 1 : 2) : i == 0 || i == out ? 2 : 4)});
  if (!workspace.empty()) gm.push_back({workspace.data(), workspace.size()});
  auto p = reinterpret_cast<GM_ADDR *>(params);
  GM_ADDR key_scales = quant ? p[7] : nullptr;
  GM_ADDR value_scales = quant ? p[8] : nullptr;
  // A launch with the Cube is mixed: block_dim groups of one AIC and two AIVs (tiling keys 4 and 5).
  const AscendC::LaunchForm form = plan.cube ? AscendC::LaunchForm::kMix12 : AscendC::LaunchForm::kAivOnly;
  return AscendC::RunCores(op, td.block_dim, key + (quant ? 2 : 0) + (plan.cube ? 4 : 0), Capacity(hw), gm, [&] {
    ms_atb_paged_attention(p[0], p[1], p[2], p[3], p[4], p[5], p[6], key_scales, value_scales, p[out],
                           workspace.empty() ? nullptr : workspace.data(), reinterpret_cast<GM_ADDR>(&td));
  }, form);
}

int ReshapeAndCache(bool quant, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  const char *op = quant ? "MsAtbReshapeAndCacheQuant" : "MsAtbReshapeAndCache";
  const int out = quant ? 7 : 5;
  if (nparam != out + 1) return Fail(op, quant ? "expected 7 inputs and 1 output" : "expected 5 inputs and 1 output");
  if (ndims[0] != 3 || ndims[1] != 3 || ndims[2] != 4 || ndims[3] != 4 || ndims[4] != 1)
    return Fail(op, "expected key/value [T, KVH, D], caches [NB, BS, KVH, D], slot_mapping [T]");
  const int key = TilingKey(dtypes[0]);
  if (key < 0) return Fail(op, "key must be float16 or bfloat16");
  if (std::strcmp(dtypes[1], dtypes[0]) != 0) return Fail(op, "key and value must share one dtype");
  const char *cache = quant ? "int8" : dtypes[0];
  for (int i = 2; i < 4; ++i)
    if (std::strcmp(dtypes[i], cache) != 0)
      return Fail(op, quant ? "the caches must be int8" : "key, value and both caches must share one dtype");
  if (std::strcmp(dtypes[4], "int32") != 0) return Fail(op, "slot_mapping must be int32");
  const int64_t *ks = shapes[0], *cs = shapes[2];
  for (int i = 0; i < 3; ++i)
    if (shapes[1][i] != ks[i]) return Fail(op, "key and value must have the same shape");
  for (int i = 0; i < 4; ++i)
    if (shapes[3][i] != cs[i]) return Fail(op, "key_cache and value_cache must have the same shape");
  if (cs[2] != ks[1] || cs[3] != ks[2]) return Fail(op, "the caches [NB, BS, KVH, D] do not match key [T, KVH, D]");
  if (shapes[4][0] != ks[0]) return Fail(op, "slot_mapping must have one entry per token");
  for (int i = 5; quant && i < 7; ++i)
    if (std::strcmp(dtypes[i], "float32") != 0 || ndims[i] != 3 || shapes[i][0] != cs[0] || shapes[i][1] != cs[1] ||
        shapes[i][2] != cs[2])
      return Fail(op, "key_scale_cache and value_scale_cache must be float32 [NB, BS, KVH]");
  const auto *slots = static_cast<const int32_t *>(params[4]);
  for (int64_t t = 0; t < ks[0]; ++t)
    if (slots[t] >= cs[0] * cs[1]) return Fail(op, "slot_mapping entry out of range");
  const ms_atb_plan::HardwareFigures hw = ms_atb_plan::AssumedAtlas800IA2();
  const ms_atb_plan::ReshapeAndCacheShape shape{ks[0], ks[1], ks[2], cs[0], cs[1], 2, quant ? 1 : 2};
  const char *why;
  const ms_atb_plan::ReshapeAndCachePlan plan = ms_atb_plan::PlanReshapeAndCache(shape, hw, &why);
  if (plan.ub_bytes == 0) return Fail(op, std::string("no tiling: ") + why);
  optiling::MsAtbReshapeAndCacheTilingData td;
  ms_atb_plan::StoreReshapeAndCache(shape, plan, td);
  std::vector<AscendC::GmTensor> gm;
  for (int i = 0; i <= out; ++i)
    gm.push_back({params[i], Elements(shapes[i], ndims[i]) * (i < 2 ? 2 : i < 4 ? (quant ? 1 : 2) : 4)});
  auto p = reinterpret_cast<GM_ADDR *>(params);
  GM_ADDR key_scales = quant ? p[5] : nullptr;
  GM_ADDR value_scales = quant ? p[6] : nullptr;
  return AscendC::RunCores(op, td.block_dim, key + (quant ? 2 : 0), Capacity(hw), gm, [&] {
    ms_atb_reshape_and_cache(p[0], p[1], p[2], p[3], p[4], key_scales, value_scales, p[out], nullptr,
                             reinterpret_cast<GM_ADDR>(&td));
  });
}

}  // namespace

extern "C" int MsAtbPagedAttention(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                   void *stream, void *extra) {
  return PagedAttention(false, nparam, params, ndims, shapes, dtypes);
}

extern "C" int MsAtbPagedAttentionQuant(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                        void *stream, void *extra) {
  return PagedAttention(true, nparam, params, ndims, shapes, dtypes);
}

extern "C" int MsAtbReshapeAndCache(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                    void *stream, void *extra) {
  return ReshapeAndCache(false, nparam, params, ndims, shapes, dtypes);
}

extern "C" int MsAtbReshapeAndCacheQuant(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                         void *stream, void *extra) {
  return ReshapeAndCache(true, nparam, params, ndims, shapes, dtypes);
}

// Tiling plans. shape: T, H, KVH, D, BS, NB, B, MAXB, element bytes, cache element bytes (paged attention)
// or T, KVH, D, NB, BS, element bytes, cache element bytes (reshape_and_cache). out: the fields of
// ops/ascendc_build.py's PAGED_ATTENTION_PLAN / RESHAPE_AND_CACHE_PLAN, in that order. Returns 1 (and
// *why) when no tiling fits.
extern "C" int MsAtbPlanPagedAttention(const int64_t *s, int64_t *out, const char **why) {
  const ms_atb_plan::HardwareFigures hw = ms_atb_plan::AssumedAtlas800IA2();
  const ms_atb_plan::PagedAttentionPlan p =
      ms_atb_plan::PlanPagedAttention({s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9]}, hw, why);
  const int64_t values[] = {p.block_dim, static_cast<int64_t>(p.ub_bytes), p.q_tile, p.head_tile, p.span, p.q_bytes,
                            p.kv_bytes, p.out_bytes, p.rows_f32_bytes, p.kv_f32_bytes, p.scores_bytes, p.stats_bytes,
                            p.work_bytes, p.p_bytes, p.stage_bytes, p.cube, p.rows_pad,
                            static_cast<int64_t>(p.l1_bytes), static_cast<int64_t>(p.l0a_bytes),
                            static_cast<int64_t>(p.l0b_bytes), static_cast<int64_t>(p.l0c_bytes), p.kv_splits,
                            p.base_items, p.ws_core_bytes, p.partial_bytes, static_cast<int64_t>(p.workspace_bytes),
                            p.cores, hw.vector_cores, hw.cube_cores, static_cast<int64_t>(hw.ub_bytes),
                            static_cast<int64_t>(hw.l1_bytes), static_cast<int64_t>(hw.l0a_bytes),
                            static_cast<int64_t>(hw.l0b_bytes), static_cast<int64_t>(hw.l0c_bytes)};
  std::memcpy(out, values, sizeof(values));
  return p.ub_bytes == 0 ? 1 : 0;
}

extern "C" int MsAtbPlanReshapeAndCache(const int64_t *s, int64_t *out, const char **why) {
  const ms_atb_plan::HardwareFigures hw = ms_atb_plan::AssumedAtlas800IA2();
  const ms_atb_plan::ReshapeAndCachePlan p =
      ms_atb_plan::PlanReshapeAndCache({s[0], s[1], s[2], s[3], s[4], s[5], s[6]}, hw, why);
  const int64_t values[] = {p.block_dim, static_cast<int64_t>(p.ub_bytes), p.chunk_elems, p.chunk_bytes,
                            hw.vector_cores, static_cast<int64_t>(hw.ub_bytes)};
  std::memcpy(out, values, sizeof(values));
  return p.ub_bytes == 0 ? 1 : 0;
}
