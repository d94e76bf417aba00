// PagedAttention: causal attention of each sequence's queries over its paged K/V cache, decode
// tokens and prefill chunks over cached prefixes alike, with GQA.
//   query [T, H, D] or [T, H * D]; key_cache, value_cache [NB, BS, KVH, D]; block_tables [B, MAXB] int32;
//   context_lens [B] int32; query_start_loc [B + 1] int32; scale [1] float32 -> out of the query's shape.
// PagedAttentionQuant takes two more inputs after scale, for int8 caches: key_scale_cache,
// value_scale_cache [NB, BS, KVH] float32 (cached value = int8 value * its token and head's scale).
// query and out share one dtype (float32, float16, bfloat16; computed in float32); the caches may be any
// of those or int8: their rows are converted to float32 as they are read.
// Sequence b owns query rows query_start_loc[b]:query_start_loc[b+1], the last tokens of its
// context_lens[b] tokens. Rows owned by no sequence are zero.
// Work item = (sequence, tile of up to kQueryTile queries, kv heads): all query heads of a kv head
// and all queries of the tile share one pass over K/V, with an online softmax per block (decode
// rows) or per span of blocks (prefill tiles: RunItemTiled, paged_attention_tiled.h). A decode row over a
// long context is cut into spans whose partial softmaxes are combined after they all ran (PlanItems,
// paged_attention_spans.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "attention_decode.h"
#include "attention_rows.h"
#include "paged_attention_spans.h"
#include "paged_attention_tiled.h"
#include "dtype.h"
#include "gemm_tile.h"
#include "kernel_profile.h"
#include "fast_math.h"
#include "prefetch.h"
#include "thread_pool.h"

namespace {

using ms_atb_paged::Args;
using ms_atb_paged::CombineSpans;
using ms_atb_paged::Item;
using ms_atb_paged::PlanItems;
using ms_atb_paged::RunItemTiled;
using ms_atb_paged::ScalesAt;
using ms_atb_paged::Scratch;
using ms_atb_paged::Tiled;
using ms_atb::AccumulateRows;
using ms_atb::DotRows;
using ms_atb::Rows;

constexpr int64_t kQueryTile = 32;
// A decode row's pass over a long context is bound by memory latency: each kv head's rows of the block
// kPrefetchBlocks ahead are asked into L2 (PrefetchL2, prefetch.h) as the head's rows of this block are read. Zen 4,
// SmolLM2's shape over 8,160 tokens in DRAM, 2 threads (scripts/bench_attention.py --long-context): 303-322 us a
// layer 4 blocks ahead, 329-336 8 ahead, 354-356 16 ahead, 514-529 with no software prefetch; 1 to 4 ahead within
// the noise of each other.
constexpr int64_t kPrefetchBlocks = 4;

// An item's rows, its pass over K/V done: normalised into out, or, for a span, as (max, sum, acc) into its slot of
// a.partials for CombineSpans.
void Finish(const Item &it, const Args &a, const Scratch &s, float *out) {
  const int64_t G = a.H / a.KVH, D = a.D, nq = it.q_end - it.q_begin, ng = it.kv_end - it.kv_begin;
  const int64_t row0 = a.query_start_loc[it.seq] + it.q_begin;
  const int64_t R = ng * nq * G;
  if (it.part >= 0) {  // a span: its rows' (max, sum, acc) for CombineSpans
    float *part = a.partials + it.part;
    for (int64_t r = 0; r < R; ++r) {
      part[r * (D + 2)] = s.m[r];
      part[r * (D + 2) + 1] = s.l[r];
      std::memcpy(part + r * (D + 2) + 2, s.acc.data() + r * D, D * sizeof(float));
    }
    return;
  }
  for (int64_t g = 0; g < ng; ++g)
    for (int64_t i = 0; i < nq; ++i)
      for (int64_t h = 0; h < G; ++h) {
        const int64_t r = (g * nq + i) * G + h;
        const float inv = 1.0f / s.l[r];
        float *dst = out + ((row0 + i) * a.H + (it.kv_begin + g) * G + h) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = s.acc[r * D + d] * inv;
      }
}

// Rows are (kv head g, query i, head h of the group); each kv head's K/V rows of a block are
// read once for all of its rows.
template <typename C>
void RunItem(const Item &it, const Args &a, const float *query, const C *key_cache, const C *value_cache, float *out,
             Scratch &s) {
  const int64_t G = a.H / a.KVH, D = a.D, BS = a.BS;
  const int64_t nq = it.q_end - it.q_begin, ng = it.kv_end - it.kv_begin;
  const int64_t RG = nq * G;  // rows per kv head
  const int64_t R = ng * RG;
  const int64_t ctx = a.context_lens[it.seq];
  const int64_t seq_q = a.query_start_loc[it.seq + 1] - a.query_start_loc[it.seq];
  const int64_t first_pos = ctx - seq_q + it.q_begin;  // position of the tile's first query
  const int64_t last_pos = first_pos + nq - 1;
  const int64_t row0 = a.query_start_loc[it.seq] + it.q_begin;
  const int64_t kv_stride = a.KVH * D;
  s.q.resize(R * D);
  s.acc.assign(R * D, 0.0f);
  s.scores.resize(R * BS);
  s.m.assign(R, -INFINITY);
  s.l.assign(R, 0.0f);
  s.valid.resize(RG);
  for (int64_t g = 0; g < ng; ++g)
    for (int64_t i = 0; i < nq; ++i)
      for (int64_t h = 0; h < G; ++h) {
        const float *src = query + ((row0 + i) * a.H + (it.kv_begin + g) * G + h) * D;
        float *dst = s.q.data() + ((g * nq + i) * G + h) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * a.scale;
      }
  const int32_t *table = a.block_tables + it.seq * a.MAXB;
  const int64_t nblocks = std::min(last_pos / BS + 1, it.j_end);
  // The first kPrefetchBlocks blocks are asked for before the pass starts, the others as it goes: a pass over
  // 32 blocks otherwise waits on a quarter of them (M's shape, 512 tokens in DRAM: 6% faster a call).
  auto prefetch = [&](int64_t j, int64_t g) {  // kv head g's K and V rows of block j, into L2
    const int64_t at = (static_cast<int64_t>(table[j]) * BS * a.KVH + it.kv_begin + g) * D;
    for (int64_t t = 0; t < BS; ++t)
      for (int64_t e = 0; e < D; e += 64 / static_cast<int64_t>(sizeof(C))) {
        ms_atb::PrefetchL2(reinterpret_cast<uintptr_t>(key_cache + at + t * kv_stride + e));
        ms_atb::PrefetchL2(reinterpret_cast<uintptr_t>(value_cache + at + t * kv_stride + e));
      }
  };
  for (int64_t j = it.j_begin; j < std::min(nblocks, it.j_begin + kPrefetchBlocks); ++j)
    for (int64_t g = 0; g < ng; ++g) prefetch(j, g);
  for (int64_t j = it.j_begin; j < nblocks; ++j) {
    const int64_t base = j * BS;
    const int64_t ntok = std::min(BS, last_pos + 1 - base);
    for (int64_t r = 0; r < RG; ++r) s.valid[r] = std::min(ntok, first_pos + r / G - base + 1);
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t offset = (static_cast<int64_t>(table[j]) * BS * a.KVH + it.kv_begin + g) * D;
      if (j + kPrefetchBlocks < nblocks) prefetch(j + kPrefetchBlocks, g);
#if defined(MS_ATB_DECODE_IN_REGISTERS)
      // A sequence's only query row of the step (a decode row) runs in registers (attention_decode.h); which
      // path a row takes follows its sequence alone, as the tiled path's choice does.
      if (seq_q == 1 && D % ms_atb::decode::kLanes == 0) {
        constexpr int64_t kTokens = ms_atb::decode::kDecodeTokens;
        const float *k_scales = ScalesAt(a.key_scales, offset, D), *v_scales = ScalesAt(a.value_scales, offset, D);
        for (int64_t t = 0; t < ntok; t += kTokens)
          ms_atb::DecodeBlock(s.q.data() + g * RG * D, G, D, key_cache + offset + t * kv_stride,
                              k_scales ? k_scales + t * a.KVH : nullptr, value_cache + offset + t * kv_stride,
                              v_scales ? v_scales + t * a.KVH : nullptr, kv_stride, a.KVH,
                              std::min(kTokens, ntok - t), s.m.data() + g * RG, s.l.data() + g * RG,
                              s.acc.data() + g * RG * D);
        continue;
      }
#endif
      int64_t ks, vs;
      const float *k = Rows(key_cache + offset, ScalesAt(a.key_scales, offset, D), a.KVH, ntok, kv_stride, D, s.k, &ks);
      const float *v =
          Rows(value_cache + offset, ScalesAt(a.value_scales, offset, D), a.KVH, ntok, kv_stride, D, s.v, &vs);
      for (int64_t rr = 0; rr < RG; ++rr) {
        const int64_t cnt = s.valid[rr], r = g * RG + rr;
        if (cnt <= 0) continue;
        const float *q = s.q.data() + r * D;
        float *sr = s.scores.data() + r * BS;
        DotRows(q, k, ks, cnt, D, sr);
        float mx = s.m[r];
        for (int64_t t = 0; t < cnt; ++t) mx = std::max(mx, sr[t]);
        float *acc = s.acc.data() + r * D;
        if (mx > s.m[r]) {
          const float alpha = ms_atb::ExpNonPositive(s.m[r] - mx);
          s.l[r] *= alpha;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) acc[d] *= alpha;
          s.m[r] = mx;
        }
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < cnt; ++t) {
          sr[t] = ms_atb::ExpNonPositive(sr[t] - mx);
          sum += sr[t];
        }
        s.l[r] += sum;
        AccumulateRows(sr, v, vs, cnt, D, acc);
      }
    }
  }
  Finish(it, a, s, out);
}

// items, then the spans' combinations (`spans`: the first item of each run of spans of one row group, and its
// count).
template <typename C>
void Run(const Args &a, const std::vector<Item> &items, const std::vector<std::pair<int64_t, int64_t>> &spans,
         const float *q, const void *kc, const void *vc, float *o) {
  ms_atb::ThreadPool &pool = ms_atb::ThreadPool::Get();
  pool.Run(static_cast<int64_t>(items.size()), [&](int64_t i) {
    thread_local Scratch scratch;
    const Item &it = items[i];
    if (Tiled(it, a)) {
      RunItemTiled<C>(it, a, q, static_cast<const C *>(kc), static_cast<const C *>(vc), o, scratch);
      return;
    }
    RunItem<C>(it, a, q, static_cast<const C *>(kc), static_cast<const C *>(vc), o, scratch);
  });
  pool.Run(static_cast<int64_t>(spans.size()),
           [&](int64_t i) { CombineSpans(a, items.data() + spans[i].first, spans[i].second, o); });
}

int Fail(const char *msg) {
  std::fprintf(stderr, "ms_atb PagedAttention: %s\n", msg);
  return 1;
}

// float32 queries and output; the caches in their own dtype.
int RunCaches(ms_atb::DType cache, const Args &a, const std::vector<Item> &items,
              const std::vector<std::pair<int64_t, int64_t>> &spans, const float *q, void **params, float *out) {
  switch (cache) {
    case ms_atb::DType::kFloat32: Run<float>(a, items, spans, q, params[1], params[2], out); return 0;
    case ms_atb::DType::kFloat16: Run<ms_atb::Half>(a, items, spans, q, params[1], params[2], out); return 0;
    case ms_atb::DType::kBFloat16: Run<ms_atb::BFloat16>(a, items, spans, q, params[1], params[2], out); return 0;
    case ms_atb::DType::kInt8: Run<int8_t>(a, items, spans, q, params[1], params[2], out); return 0;
    default: return Fail("caches must be float32, float16, bfloat16 or int8");
  }
}

// Both entry points: `quant` takes key_scale_cache and value_scale_cache after scale.
int Attend(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, bool quant) {
  if (nparam != (quant ? 10 : 8)) return Fail(quant ? "expected 9 inputs and 1 output" : "expected 7 inputs and 1 output");
  if ((ndims[0] != 3 && ndims[0] != 2) || ndims[1] != 4 || ndims[2] != 4 || ndims[3] != 2 || ndims[4] != 1 ||
      ndims[5] != 1)
    return Fail("expected query [T, H, D] or [T, H * D], caches [NB, BS, KVH, D], block_tables [B, MAXB], "
                "context_lens [B], query_start_loc [B + 1]");
  Args a;
  const int64_t T = shapes[0][0];
  a.D = ndims[0] == 3 ? shapes[0][2] : shapes[1][3];  // [T, H * D]: the caches' D splits the row
  if (a.D < 1 || shapes[0][ndims[0] - 1] % a.D != 0) return Fail("query [T, H * D]: its width must be a multiple of D");
  a.H = ndims[0] == 3 ? shapes[0][1] : shapes[0][1] / a.D;
  const int64_t NB = shapes[1][0];
  a.BS = shapes[1][1];
  a.KVH = shapes[1][2];
  const int64_t B = shapes[3][0];
  a.MAXB = shapes[3][1];
  for (int i = 0; i < 4; ++i)
    if (shapes[1][i] != shapes[2][i]) return Fail("key_cache and value_cache must have the same shape");
  if (shapes[1][3] != a.D) return Fail("cache head_dim differs from the query's");
  if (a.KVH <= 0 || a.H % a.KVH != 0) return Fail("num_heads must be a multiple of num_kv_heads");
  if (shapes[4][0] != B || shapes[5][0] != B + 1) return Fail("need context_lens [B] and query_start_loc [B + 1]");
  const ms_atb::DType dt = ms_atb::ParseDType(dtypes[0]), cache = ms_atb::ParseDType(dtypes[1]);
  if (dt != ms_atb::DType::kFloat32 && dt != ms_atb::DType::kFloat16 && dt != ms_atb::DType::kBFloat16)
    return Fail("query must be float32, float16 or bfloat16");
  if (ms_atb::ParseDType(dtypes[2]) != cache) return Fail("key_cache and value_cache must share one dtype");
  if ((cache == ms_atb::DType::kInt8) != quant)
    return Fail(quant ? "PagedAttentionQuant takes int8 caches" : "int8 caches need their scales (PagedAttentionQuant)");
  for (int i = 3; i < 6; ++i)
    if (ms_atb::ParseDType(dtypes[i]) != ms_atb::DType::kInt32) return Fail("index inputs must be int32");
  if (ms_atb::ParseDType(dtypes[6]) != ms_atb::DType::kFloat32 || shapes[6][0] != 1) return Fail("scale must be float32 [1]");
  a.key_scales = a.value_scales = nullptr;
  if (quant) {
    for (int i = 7; i < 9; ++i)
      if (ndims[i] != 3 || shapes[i][0] != NB || shapes[i][1] != a.BS || shapes[i][2] != a.KVH ||
          ms_atb::ParseDType(dtypes[i]) != ms_atb::DType::kFloat32)
        return Fail("key_scale_cache and value_scale_cache must be float32 [NB, BS, KVH]");
    a.key_scales = static_cast<const float *>(params[7]);
    a.value_scales = static_cast<const float *>(params[8]);
  }
  a.block_tables = static_cast<const int32_t *>(params[3]);
  a.context_lens = static_cast<const int32_t *>(params[4]);
  a.query_start_loc = static_cast<const int32_t *>(params[5]);
  a.scale = *static_cast<const float *>(params[6]);
  const int32_t *qsl = a.query_start_loc;
  if (qsl[0] < 0 || qsl[B] > T) return Fail("query_start_loc out of [0, T]");
  std::vector<Item> items;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t nq = qsl[b + 1] - qsl[b], ctx = a.context_lens[b];
    if (nq < 0) return Fail("query_start_loc must be non-decreasing");
    if (nq == 0) continue;
    if (ctx < nq) return Fail("context_lens[b] must be >= the sequence's query count");
    const int64_t nblocks = (ctx + a.BS - 1) / a.BS;
    if (nblocks > a.MAXB) return Fail("context_lens[b] needs more blocks than block_tables has columns");
    for (int64_t j = 0; j < nblocks; ++j) {
      const int32_t blk = a.block_tables[b * a.MAXB + j];
      if (blk < 0 || blk >= NB) return Fail("block_tables entry out of range");
    }
    for (int64_t q0 = 0; q0 < nq; q0 += kQueryTile) {
      const int64_t q1 = std::min(nq, q0 + kQueryTile);
      items.push_back({b, 0, a.KVH, q0, q1, (ctx - nq + q1) * (q1 - q0 + 1)});
    }
  }
  std::vector<std::pair<int64_t, int64_t>> spans;
  int64_t parts = 0;
  PlanItems(a, items, spans, parts);
  std::unique_ptr<float[]> partials;  // each span's Finish writes its whole slot
  if (parts > 0) {
    partials.reset(new float[parts]);
    a.partials = partials.get();
  }

  // Queries and output are float32 inside; float16 and bfloat16 ones are converted on the way in and out.
  const int64_t n = T * a.H * a.D;
  const bool wide = dt == ms_atb::DType::kFloat32;
  std::vector<float> q_buf, out_buf;
  float *out = static_cast<float *>(params[nparam - 1]);
  const float *q = static_cast<const float *>(params[0]);
  if (wide) {
    std::memset(out, 0, qsl[0] * a.H * a.D * sizeof(float));
    std::memset(out + qsl[B] * a.H * a.D, 0, (T - qsl[B]) * a.H * a.D * sizeof(float));
  } else {
    q_buf.resize(n);
    out_buf.assign(n, 0.0f);
    auto convert = dt == ms_atb::DType::kFloat16 ? ms_atb::Convert<ms_atb::Half> : ms_atb::Convert<ms_atb::BFloat16>;
    convert(params[0], q_buf.data(), n, false);
    q = q_buf.data();
    out = out_buf.data();
  }
  const int status = RunCaches(cache, a, items, spans, q, params, out);
  if (!wide && status == 0)
    (dt == ms_atb::DType::kFloat16 ? ms_atb::Convert<ms_atb::Half> : ms_atb::Convert<ms_atb::BFloat16>)(params[nparam - 1], out, n, true);
  return status;
}

}  // namespace

extern "C" std::vector<int64_t> PagedAttentionInferShape(int *ndims, int64_t **shapes, void *extra) {
  return std::vector<int64_t>(shapes[0], shapes[0] + ndims[0]);  // the query's shape
}

extern "C" std::vector<int64_t> PagedAttentionQuantInferShape(int *ndims, int64_t **shapes, void *extra) {
  return std::vector<int64_t>(shapes[0], shapes[0] + ndims[0]);
}

extern "C" int PagedAttention(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                              void *stream, void *extra) {
  ms_atb::KernelScope profile_scope("PagedAttention");
  return Attend(nparam, params, ndims, shapes, dtypes, false);
}

extern "C" int PagedAttentionQuant(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                   void *stream, void *extra) {
  ms_atb::KernelScope profile_scope("PagedAttention");
  return Attend(nparam, params, ndims, shapes, dtypes, true);
}
