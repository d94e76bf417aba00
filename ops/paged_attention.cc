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
// rows) or per span of blocks (prefill tiles: RunItemTiled).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attention_rows.h"
#include "dtype.h"
#include "gemm_tile.h"
#include "kernel_profile.h"
#include "fast_math.h"
#include "thread_pool.h"

namespace {

using ms_atb::AccumulateRows;
using ms_atb::DotRows;
using ms_atb::Rows;

constexpr int64_t kQueryTile = 32;
constexpr int64_t kTiledRows = 16;  // rows per kv head from which the GEMM-tiled path pays
constexpr int64_t kSpanTokens = 48;  // cache tokens per softmax update in the GEMM-tiled path

struct Item {
  int64_t seq, kv_begin, kv_end, q_begin, q_end;  // q_* index into the sequence's queries
  int64_t cost;
};

struct Args {
  int64_t H, KVH, D, BS, MAXB;
  const int32_t *block_tables, *context_lens, *query_start_loc;
  const float *key_scales, *value_scales;  // [NB, BS, KVH] for int8 caches; null otherwise
  float scale;
};

// The scales of the KVH-strided rows that start at cache element offset `offset` (a multiple of D), or null.
inline const float *ScalesAt(const float *scales, int64_t offset, int64_t D) {
  return scales ? scales + offset / D : nullptr;
}

struct Scratch {
  std::vector<float> q, acc, scores, m, l, k, v;
  std::vector<float> row_max, row_sum, alpha, valid_f;
  std::vector<int64_t> valid;
};

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
  const int64_t nblocks = last_pos / BS + 1;
  for (int64_t j = 0; j < nblocks; ++j) {
    const int64_t base = j * BS;
    const int64_t ntok = std::min(BS, last_pos + 1 - base);
    for (int64_t r = 0; r < RG; ++r) s.valid[r] = std::min(ntok, first_pos + r / G - base + 1);
    if (j + 1 < nblocks) {  // the next block is elsewhere in memory: start loading it now
      const int64_t next = (static_cast<int64_t>(table[j + 1]) * BS * a.KVH + it.kv_begin) * D;
      for (int64_t t = 0; t < BS; ++t)
        for (int64_t e = 0; e < ng * D; e += 64 / static_cast<int64_t>(sizeof(C))) {
          __builtin_prefetch(key_cache + next + t * kv_stride + e);
          __builtin_prefetch(value_cache + next + t * kv_stride + e);
        }
    }
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t offset = (static_cast<int64_t>(table[j]) * BS * a.KVH + it.kv_begin + g) * D;
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
  for (int64_t g = 0; g < ng; ++g)
    for (int64_t i = 0; i < nq; ++i)
      for (int64_t h = 0; h < G; ++h) {
        const int64_t r = (g * nq + i) * G + h;
        const float inv = 1.0f / s.l[r];
        float *dst = out + ((row0 + i) * a.H + (it.kv_begin + g) * G + h) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = s.acc[r * D + d] * inv;
      }
}

// The K or V rows [ntok, D] of kv head `head` in blocks j0.. of a table, as float32 rows of stride
// *stride: read in place when they are float32 and the blocks are consecutive (`consecutive`: a
// contiguous table), else gathered into buf (converted; int8 rows times their `scales`, or null).
template <typename C>
const float *SpanRows(const C *cache, const float *scales, const int32_t *table, int64_t j0, int64_t ntok,
                      bool consecutive, int64_t head, const Args &a, std::vector<float> &buf, int64_t *stride) {
  const int64_t BS = a.BS, D = a.D, kv_stride = a.KVH * D;
  const C *first = cache + (static_cast<int64_t>(table[j0]) * BS * a.KVH + head) * D;
  if (std::is_same<C, float>::value && consecutive) {
    *stride = kv_stride;
    return reinterpret_cast<const float *>(first);
  }
  if (buf.size() < static_cast<size_t>(ntok * D)) buf.resize(ntok * D);
  for (int64_t t = 0; t < ntok; ++t) {
    const int64_t row = (static_cast<int64_t>(table[j0 + t / BS]) * BS + t % BS) * a.KVH + head;
    ms_atb::RowToFloat(cache + row * D, scales ? scales[row] : 1.0f, D, buf.data() + t * D);
  }
  *stride = D;
  return buf.data();
}

// Many rows per kv head (prefill tiles): the cache is read in spans of whole blocks, about
// kSpanTokens tokens, with one online-softmax update per span. S^T [ntok, RP] = K [ntok, D] @ Q^T
// (queries packed once per item as 16-column panels [RP / 16, D, 16]), a softmax vectorised over
// rows, then acc [RG, D] += P [RG, ntok] @ V [ntok, D], P read from S^T.
template <typename C>
void RunItemTiled(const Item &it, const Args &a, const float *query, const C *key_cache, const C *value_cache,
                  float *out, Scratch &s) {
  constexpr int64_t kPanel = ms_atb::kTileCols;
  const int64_t G = a.H / a.KVH, D = a.D, BS = a.BS;
  const int64_t nq = it.q_end - it.q_begin, ng = it.kv_end - it.kv_begin;
  const int64_t RG = nq * G;                                     // rows per kv head
  const int64_t RP = (RG + kPanel - 1) / kPanel * kPanel;         // padded to whole panels
  const int64_t ctx = a.context_lens[it.seq];
  const int64_t seq_q = a.query_start_loc[it.seq + 1] - a.query_start_loc[it.seq];
  const int64_t first_pos = ctx - seq_q + it.q_begin;
  const int64_t last_pos = first_pos + nq - 1;
  const int64_t row0 = a.query_start_loc[it.seq] + it.q_begin;
  const int64_t span_blocks = std::max<int64_t>(1, kSpanTokens / BS);
  s.q.assign(ng * RP * D, 0.0f);    // [ng, RP / 16, D, 16]: scaled queries, transposed into panels
  s.acc.assign(ng * RP * D, 0.0f);  // [ng, RP, D]
  s.m.assign(ng * RP, -INFINITY);
  s.l.assign(ng * RP, 0.0f);
  s.scores.resize(span_blocks * BS * RP);  // [ntok, RP]
  s.row_max.resize(RP);
  s.row_sum.resize(RP);
  s.alpha.resize(RP);
  s.valid_f.resize(RP);
  for (int64_t g = 0; g < ng; ++g)
    for (int64_t i = 0; i < nq; ++i)
      for (int64_t h = 0; h < G; ++h) {
        const int64_t r = i * G + h;
        const float *src = query + ((row0 + i) * a.H + (it.kv_begin + g) * G + h) * D;
        float *dst = s.q.data() + g * RP * D + (r / kPanel) * D * kPanel + r % kPanel;
        for (int64_t d = 0; d < D; ++d) dst[d * kPanel] = src[d] * a.scale;
      }
  const int32_t *table = a.block_tables + it.seq * a.MAXB;
  const int64_t nblocks = last_pos / BS + 1;
  float *st = s.scores.data(), *mx = s.row_max.data(), *sum = s.row_sum.data(), *alpha = s.alpha.data();
  float *valid = s.valid_f.data();
  for (int64_t j0 = 0; j0 < nblocks; j0 += span_blocks) {
    const int64_t j1 = std::min(nblocks, j0 + span_blocks);
    const int64_t base = j0 * BS;
    const int64_t ntok = std::min(j1 * BS, last_pos + 1) - base;
    bool consecutive = true;  // the span's blocks are one run of ids
    for (int64_t j = j0 + 1; consecutive && j < j1; ++j) consecutive = table[j] == table[j - 1] + 1;
    // Every real row sees the whole span when it ends at or before the first query's position: no mask (the
    // padding rows, whose queries are zero, are never written out).
    const bool unmasked = base + ntok - 1 <= first_pos;
    for (int64_t r = 0; r < RP; ++r)
      valid[r] = r < RG ? static_cast<float>(std::min(ntok, first_pos + r / G - base + 1)) : 0.0f;
    for (int64_t g = 0; g < ng; ++g) {
      int64_t ks, vs;
      const float *k = SpanRows(key_cache, a.key_scales, table, j0, ntok, consecutive, it.kv_begin + g, a, s.k, &ks);
      const float *v =
          SpanRows(value_cache, a.value_scales, table, j0, ntok, consecutive, it.kv_begin + g, a, s.v, &vs);
      float *m = s.m.data() + g * RP, *l = s.l.data() + g * RP, *acc = s.acc.data() + g * RP * D;
      ms_atb::PanelProduct(ntok, k, ks, s.q.data() + g * RP * D, D * kPanel, RP / kPanel, D, st, RP, false);
#pragma omp simd
      for (int64_t r = 0; r < RP; ++r) {
        mx[r] = m[r];
        sum[r] = 0.0f;
      }
      if (unmasked) {
        for (int64_t t = 0; t < ntok; ++t) {
          const float *srow = st + t * RP;
#pragma omp simd
          for (int64_t r = 0; r < RP; ++r) mx[r] = std::max(mx[r], srow[r]);
        }
      } else {
        for (int64_t t = 0; t < ntok; ++t) {
          const float *srow = st + t * RP;
          const float tf = static_cast<float>(t);
#pragma omp simd
          for (int64_t r = 0; r < RP; ++r) mx[r] = tf < valid[r] ? std::max(mx[r], srow[r]) : mx[r];
        }
      }
#pragma omp simd
      for (int64_t r = 0; r < RP; ++r) {
        const bool none = mx[r] == -INFINITY;
        alpha[r] = none ? 1.0f : ms_atb::ExpNonPositive(m[r] - mx[r]);
        m[r] = mx[r];
      }
      if (unmasked) {
        for (int64_t t = 0; t < ntok; ++t) {
          float *srow = st + t * RP;
#pragma omp simd
          for (int64_t r = 0; r < RP; ++r) {
            srow[r] = ms_atb::ExpNonPositive(srow[r] - mx[r]);
            sum[r] += srow[r];
          }
        }
      } else {
        for (int64_t t = 0; t < ntok; ++t) {
          float *srow = st + t * RP;
          const float tf = static_cast<float>(t);
#pragma omp simd
          for (int64_t r = 0; r < RP; ++r) {
            const float e = ms_atb::ExpNonPositive(srow[r] - mx[r]);
            srow[r] = tf < valid[r] ? e : 0.0f;
            sum[r] += srow[r];
          }
        }
      }
      for (int64_t r = 0; r < RG; ++r) {
        l[r] = l[r] * alpha[r] + sum[r];
        if (alpha[r] != 1.0f) {
          float *ar = acc + r * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) ar[d] *= alpha[r];
        }
      }
      for (int64_t r0 = 0; r0 < RG; r0 += ms_atb::kTileRows)
        for (int64_t c = 0; c < D; c += kPanel)
          ms_atb::GemmRows(std::min(ms_atb::kTileRows, RG - r0), st + r0, 1, RP, v + c, vs, acc + r0 * D + c, D,
                           ntok, true);
    }
  }
  for (int64_t g = 0; g < ng; ++g)
    for (int64_t i = 0; i < nq; ++i)
      for (int64_t h = 0; h < G; ++h) {
        const int64_t r = i * G + h;
        const float inv = 1.0f / s.l[g * RP + r];
        const float *src = s.acc.data() + (g * RP + r) * D;
        float *dst = out + ((row0 + i) * a.H + (it.kv_begin + g) * G + h) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * inv;
      }
}

template <typename C>
void Run(const Args &a, const std::vector<Item> &items, const float *q, const void *kc, const void *vc, float *o) {
  ms_atb::ThreadPool::Get().Run(static_cast<int64_t>(items.size()), [&](int64_t i) {
    thread_local Scratch scratch;
    const Item &it = items[i];
    if ((it.q_end - it.q_begin) * (a.H / a.KVH) >= kTiledRows && a.D % ms_atb::kTileCols == 0) {
      RunItemTiled<C>(it, a, q, static_cast<const C *>(kc), static_cast<const C *>(vc), o, scratch);
      return;
    }
    RunItem<C>(it, a, q, static_cast<const C *>(kc), static_cast<const C *>(vc), o, scratch);
  });
}

int Fail(const char *msg) {
  std::fprintf(stderr, "ms_atb PagedAttention: %s\n", msg);
  return 1;
}

// float32 queries and output; the caches in their own dtype.
int RunCaches(ms_atb::DType cache, const Args &a, const std::vector<Item> &items, const float *q, void **params,
              float *out) {
  switch (cache) {
    case ms_atb::DType::kFloat32: Run<float>(a, items, q, params[1], params[2], out); return 0;
    case ms_atb::DType::kFloat16: Run<ms_atb::Half>(a, items, q, params[1], params[2], out); return 0;
    case ms_atb::DType::kBFloat16: Run<ms_atb::BFloat16>(a, items, q, params[1], params[2], out); return 0;
    case ms_atb::DType::kInt8: Run<int8_t>(a, items, q, params[1], params[2], out); return 0;
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
  // Few (sequence, tile) items: split them over kv heads too, so every thread has work.
  if (static_cast<int64_t>(items.size()) < 4 * ms_atb::ThreadPool::Get().num_threads() && a.KVH > 1) {
    std::vector<Item> split;
    for (const Item &it : items)
      for (int64_t g = 0; g < a.KVH; ++g) split.push_back({it.seq, g, g + 1, it.q_begin, it.q_end, it.cost});
    items.swap(split);
  }
  std::stable_sort(items.begin(), items.end(), [](const Item &x, const Item &y) { return x.cost > y.cost; });

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
  const int status = RunCaches(cache, a, items, q, params, out);
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
