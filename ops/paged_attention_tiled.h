// The pieces of PagedAttention (ops/paged_attention.cc) that its prefill tiles use: the work item, the
// arguments, per-thread scratch, which sequences take the tiled path (Tiled), and RunItemTiled, which reads
// the cache in spans of whole blocks and multiplies them with the register tile of gemm_tile.h. Included by
// paged_attention.cc and paged_attention_spans.h only.
#ifndef MS_ATB_OPS_PAGED_ATTENTION_TILED_H_
#define MS_ATB_OPS_PAGED_ATTENTION_TILED_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attention_rows.h"
#include "dtype.h"
#include "fast_math.h"
#include "gemm_tile.h"

namespace ms_atb_paged {

using ms_atb::AccumulateRows;
using ms_atb::DotRows;
using ms_atb::Rows;

constexpr int64_t kSpanTokens = 48;  // cache tokens per softmax update in the GEMM-tiled path

struct Item {
  int64_t seq, kv_begin, kv_end, q_begin, q_end;  // q_* index into the sequence's queries
  int64_t cost;
  // A span of a long context (decode items only): blocks [j_begin, j_end) of the table, its partial softmax
  // written to Args::partials from float `part` on and combined after all items ran; part -1: the whole context.
  int64_t j_begin = 0, j_end = INT64_MAX, part = -1;
};

struct Args {
  int64_t H, KVH, D, BS, MAXB;
  const int32_t *block_tables, *context_lens, *query_start_loc;
  const float *key_scales, *value_scales;  // [NB, BS, KVH] for int8 caches; null otherwise
  float scale;
  float *partials = nullptr;  // [parts][rows][D + 2]: each span item's rows as (max, sum, acc [D])
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

// The GEMM-tiled path takes every row of a sequence with two or more queries in the call (a prompt chunk), the
// per-block path a sequence's single query (a decode token). The two round differently, so the choice hangs on the
// sequence, never on how many of its rows share a tile: a prompt row comes out the same in any chunk of two or more
// rows, which is what makes a prefix hit give the tokens of recomputing (the scheduler never computes a prompt row
// of a longer prompt alone: ms_atb/core/scheduler.py, chunk_size).
inline bool Tiled(const Item &it, const Args &a) {
  return a.query_start_loc[it.seq + 1] - a.query_start_loc[it.seq] >= 2 && a.D % ms_atb::kTileCols == 0;
}

}  // namespace ms_atb_paged

#endif  // MS_ATB_OPS_PAGED_ATTENTION_TILED_H_
