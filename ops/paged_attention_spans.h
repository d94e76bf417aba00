// How PagedAttention (ops/paged_attention.cc) spreads a decode row over a long context: its blocks are cut into
// spans of equal length, at most kSpanBlocks blocks each, run as items of their own, and their partial softmaxes
// (max, sum, weighted values) combined after all of them ran: one long sequence keeps every thread busy. A span
// covers every kv head, so it reads its blocks' K and V rows front to back (a block's rows are its tokens' heads side
// by side); only when the spans would be too few to share among the threads is each one cut by kv head too. The
// spans follow from the context length alone, so a row's result depends on its context alone, never on the batch or
// the thread count. Included by paged_attention.cc only.
#ifndef MS_ATB_OPS_PAGED_ATTENTION_SPANS_H_
#define MS_ATB_OPS_PAGED_ATTENTION_SPANS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "fast_math.h"
#include "paged_attention_tiled.h"
#include "thread_pool.h"

namespace ms_atb_paged {

constexpr int64_t kSpanBlocks = 64;  // blocks of a decode span, at most: 1,024 tokens at 16 a block

// Floats of a span item's slot in Args::partials: (max, sum, acc [D]) for each of its rows.
inline int64_t SlotFloats(const Args &a, const Item &it) {
  return (it.kv_end - it.kv_begin) * (it.q_end - it.q_begin) * (a.H / a.KVH) * (a.D + 2);
}

// The rows of the spans items[first, first + n) of one (sequence, query tile, kv heads), in span order, into out:
// max m = max of the spans' maxima, sum = sum of l_s e^(m_s - m), out = sum of acc_s e^(m_s - m) / sum.
inline void CombineSpans(const Args &a, const Item *spans, int64_t n, float *out) {
  const Item &it = spans[0];
  const int64_t G = a.H / a.KVH, D = a.D, nq = it.q_end - it.q_begin, R = (it.kv_end - it.kv_begin) * nq * G;
  const int64_t row0 = a.query_start_loc[it.seq] + it.q_begin;
  std::vector<float> acc(D);
  for (int64_t r = 0; r < R; ++r) {
    float m = -INFINITY, l = 0.0f;
    for (int64_t k = 0; k < n; ++k) m = std::max(m, a.partials[spans[k].part + r * (D + 2)]);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t k = 0; k < n; ++k) {
      const float *part = a.partials + spans[k].part + r * (D + 2);
      if (part[1] == 0.0f) continue;  // no token of this span is visible to the row
      const float w = ms_atb::ExpNonPositive(part[0] - m);
      l += part[1] * w;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[d] += part[2 + d] * w;
    }
    const int64_t g = r / (nq * G), i = r / G % nq, h = r % G;  // rows as RunItem lays them out
    float *dst = out + ((row0 + i) * a.H + (it.kv_begin + g) * G + h) * D;
    for (int64_t d = 0; d < D; ++d) dst[d] = acc[d] * (1.0f / l);
  }
}

// Cuts item `it`, a decode row group over nblocks blocks, into its spans: equal ones of at most kSpanBlocks blocks,
// over the item's kv heads together or (by_head) one kv head each. Each takes the next slot of Args::partials
// (`parts` counts their floats); `spans` gets (first span, count) of each row group.
inline void SplitSpans(const Args &a, const Item &it, int64_t nblocks, bool by_head, std::vector<Item> &split,
                std::vector<std::pair<int64_t, int64_t>> &spans, int64_t &parts) {
  const int64_t count = (nblocks + kSpanBlocks - 1) / kSpanBlocks, length = (nblocks + count - 1) / count;
  const int64_t step = by_head ? 1 : it.kv_end - it.kv_begin;
  for (int64_t g = it.kv_begin; g < it.kv_end; g += step) {
    spans.emplace_back(static_cast<int64_t>(split.size()), count);
    for (int64_t j = 0; j < nblocks; j += length) {
      split.push_back({it.seq, g, g + step, it.q_begin, it.q_end, std::min(nblocks - j, length), j, j + length, parts});
      parts += SlotFloats(a, split.back());
    }
  }
}

// The work items of the sequences (ops/paged_attention.cc), the longest first, and the runs of spans of each
// row group split over a long context (first item, count), those kept in order and after the others; their
// partial results take `parts` floats of Args::partials.
inline void PlanItems(const Args &a, std::vector<Item> &items, std::vector<std::pair<int64_t, int64_t>> &spans,
               int64_t &parts) {
  std::vector<Item> whole, split;
  std::vector<std::pair<Item, int64_t>> long_items;  // (item, its blocks)
  int64_t joint_spans = 0;
  for (const Item &it : items) {
    const int64_t nblocks = (a.context_lens[it.seq] - (a.query_start_loc[it.seq + 1] - a.query_start_loc[it.seq]) +
                             it.q_end - 1) / a.BS + 1;
    if (Tiled(it, a) || nblocks <= kSpanBlocks) {
      whole.push_back(it);
      continue;
    }
    long_items.emplace_back(it, nblocks);
    joint_spans += (nblocks + kSpanBlocks - 1) / kSpanBlocks;
  }
  const int64_t threads = ms_atb::ThreadPool::Get().num_threads();
  const bool by_head = static_cast<int64_t>(whole.size()) + joint_spans < 2 * threads;
  for (const auto &[it, nblocks] : long_items) SplitSpans(a, it, nblocks, by_head, split, spans, parts);
  // Few whole items: split them over kv heads too, so every thread has work, into runs of adjacent heads (an
  // item a thread, as far as the heads go): an item reads each token's row of its heads as one piece, and the
  // wider the piece, the faster a pass over K/V in DRAM goes (M's shape, one row over 512 tokens, 64 layers' K/V
  // in turn, alternated: 4 heads an item faster than 2 in 22 rounds of 24, 126-157 us a call against 130-177;
  // 2 heads faster than 1).
  if (static_cast<int64_t>(whole.size() + split.size()) < 4 * threads && a.KVH > 1 && !whole.empty()) {
    const int64_t n = static_cast<int64_t>(whole.size());
    const int64_t pieces = std::min<int64_t>(a.KVH, (threads + n - 1) / n);
    const int64_t width = (a.KVH + pieces - 1) / pieces;
    std::vector<Item> by_kv_heads;
    for (const Item &it : whole)
      for (int64_t g = it.kv_begin; g < it.kv_end; g += width)
        by_kv_heads.push_back({it.seq, g, std::min(g + width, it.kv_end), it.q_begin, it.q_end, it.cost});
    whole.swap(by_kv_heads);
  }
  std::stable_sort(whole.begin(), whole.end(), [](const Item &x, const Item &y) { return x.cost > y.cost; });
  for (auto &run : spans) run.first += static_cast<int64_t>(whole.size());
  items = whole;
  items.insert(items.end(), split.begin(), split.end());
}

}  // namespace ms_atb_paged

#endif  // MS_ATB_OPS_PAGED_ATTENTION_SPANS_H_
