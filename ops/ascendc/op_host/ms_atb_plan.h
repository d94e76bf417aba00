// Tiling plans of the ms_atb AscendC ops, computed from the shapes and the hardware figures alone
// (plain C++: the op_host tiling functions and the CPU verification call the same code).
//
// Hardware figures assumed for the Atlas 800I A2 (Ascend 910B) when the platform cannot be asked
// (on the NPU the tiling functions read them from the platform instead); sources in
// ops/ascendc/README.md: 20 AI cores (Cube), 40 vector cores, unified buffer 192 KiB per vector
// core, L1 512 KiB, L0A 64 KiB, L0B 64 KiB, L0C 128 KiB per AI core.
#ifndef MS_ATB_PLAN_H_
#define MS_ATB_PLAN_H_

#include <algorithm>
#include <cstdint>

#include "ms_atb_paged_attention_tiling.h"
#include "ms_atb_reshape_and_cache_tiling.h"

namespace ms_atb_plan {

struct HardwareFigures {
  uint32_t vector_cores, cube_cores;
  uint64_t ub_bytes, l1_bytes, l0a_bytes, l0b_bytes, l0c_bytes;
};

inline HardwareFigures AssumedAtlas800IA2() {
  return {40, 20, 192 * 1024, 512 * 1024, 64 * 1024, 64 * 1024, 128 * 1024};
}

constexpr uint32_t kAlign = 32;          // bytes: copies and vector operands come in 32-byte blocks
constexpr uint32_t kTokenGrain = 16;     // span granularity (cache tokens)
constexpr uint32_t kMaxSpan = 128;       // cache tokens per softmax step, at most
constexpr uint32_t kMaxQueryTile = 16;   // queries per work item, at most

inline uint32_t Align(uint64_t bytes) { return static_cast<uint32_t>((bytes + kAlign - 1) / kAlign * kAlign); }

struct PagedAttentionShape {
  int64_t num_tokens, num_heads, num_kv_heads, head_dim, block_size, num_blocks, num_seqs, max_blocks;
  int64_t elem_bytes;  // 2: float16 or bfloat16
};

// Unified-buffer bytes of one core: q (1 buffer), K and V (2 buffers each: double buffering),
// out (1), query rows and accumulators in float32, K and V spans in float32, scores, 4 statistics
// vectors (m, l, new m, alpha) and the reduction scratch.
inline uint64_t PagedAttentionUb(optiling::MsAtbPagedAttentionTilingData &t, int64_t elem_bytes) {
  const uint64_t rows = uint64_t{t.q_tile} * t.head_tile, d = t.head_dim, span = t.span;
  t.q_bytes = Align(rows * d * elem_bytes);
  t.kv_bytes = Align(span * d * elem_bytes);
  t.out_bytes = t.q_bytes;
  t.rows_f32_bytes = Align(rows * d * 4);
  t.kv_f32_bytes = Align(span * d * 4);
  t.scores_bytes = Align(rows * span * 4);
  t.stats_bytes = Align(rows * 4);
  t.work_bytes = Align(std::max<uint64_t>(span, d) * 4);
  return uint64_t{t.q_bytes} + 4ull * t.kv_bytes + t.out_bytes + 2ull * t.rows_f32_bytes + 2ull * t.kv_f32_bytes +
         t.scores_bytes + 4ull * t.stats_bytes + 2ull * t.work_bytes;
}

// Fills t; returns the unified-buffer bytes one core asks for, or 0 when no tiling fits (then *why
// says which limit). Work item = (sequence, q_tile queries, KV head, head_tile heads of its group);
// the cache is read in spans of `span` tokens with one online-softmax update per span.
inline uint64_t PlanPagedAttention(const PagedAttentionShape &s, const HardwareFigures &hw,
                                   optiling::MsAtbPagedAttentionTilingData &t, const char **why) {
  *why = "";
  if (s.num_kv_heads < 1 || s.num_heads % s.num_kv_heads != 0) { *why = "num_heads % num_kv_heads"; return 0; }
  if ((s.head_dim * s.elem_bytes) % kAlign != 0) { *why = "head_dim * element bytes % 32"; return 0; }
  const int64_t group = s.num_heads / s.num_kv_heads;
  const int64_t max_context = std::max<int64_t>(1, s.max_blocks * s.block_size);
  const int64_t max_queries = std::max<int64_t>(1, s.num_tokens - std::max<int64_t>(s.num_seqs, 1) + 1);
  t.num_tokens = s.num_tokens; t.num_heads = s.num_heads; t.num_kv_heads = s.num_kv_heads;
  t.head_dim = s.head_dim; t.block_size = s.block_size; t.num_blocks = s.num_blocks;
  t.num_seqs = s.num_seqs; t.max_blocks = s.max_blocks;
  uint64_t ub = 0;
  // Largest head tile (a divisor of the group), then the largest query tile, then the longest span.
  for (int64_t head_tile = group; head_tile >= 1 && ub == 0; --head_tile) {
    if (group % head_tile) continue;
    t.head_tile = static_cast<uint32_t>(head_tile);
    const int64_t q_max = std::min<int64_t>(max_queries, kMaxQueryTile);
    for (int64_t q_tile = q_max; q_tile >= 1 && ub == 0; q_tile /= 2) {
      t.q_tile = static_cast<uint32_t>(q_tile);
      const int64_t span_max = std::min<int64_t>(kMaxSpan, (max_context + kTokenGrain - 1) / kTokenGrain * kTokenGrain);
      for (int64_t span = span_max; span >= kTokenGrain; span -= kTokenGrain) {
        t.span = static_cast<uint32_t>(span);
        const uint64_t need = PagedAttentionUb(t, s.elem_bytes);
        if (need <= hw.ub_bytes) { ub = need; break; }
      }
    }
  }
  if (ub == 0) { *why = "unified buffer: one query, one head and 16 cache tokens do not fit"; return 0; }
  // An upper bound on the work items over every split of T queries into B sequences.
  const int64_t seq_tiles = std::min<int64_t>(s.num_tokens, std::max<int64_t>(s.num_seqs, 1) + s.num_tokens / t.q_tile);
  const int64_t items = seq_tiles * s.num_kv_heads * (group / t.head_tile);
  t.block_dim = static_cast<uint32_t>(std::max<int64_t>(1, std::min<int64_t>(hw.vector_cores, items)));
  return ub;
}

struct ReshapeAndCacheShape {
  int64_t num_tokens, num_kv_heads, head_dim, num_blocks, block_size, elem_bytes;
};

// Each core copies the K and V rows of every block_dim-th token through two staging buffers of
// chunk_elems elements; a row larger than the buffers is copied in chunks.
inline uint64_t PlanReshapeAndCache(const ReshapeAndCacheShape &s, const HardwareFigures &hw,
                                    optiling::MsAtbReshapeAndCacheTilingData &t, const char **why) {
  *why = "";
  const int64_t row = s.num_kv_heads * s.head_dim;
  if ((s.head_dim * s.elem_bytes) % kAlign != 0) { *why = "head_dim * element bytes % 32"; return 0; }
  const int64_t per_buffer = static_cast<int64_t>(hw.ub_bytes / 2) / kAlign * kAlign / s.elem_bytes;
  const int64_t grain = kAlign / s.elem_bytes;
  int64_t chunk = std::min<int64_t>(row, per_buffer) / grain * grain;
  while (row % chunk) chunk -= grain;  // equal chunks: a whole number of them per row
  t.num_tokens = s.num_tokens; t.row_elems = row; t.num_slots = s.num_blocks * s.block_size;
  t.chunk_elems = chunk; t.chunk_bytes = Align(chunk * s.elem_bytes);
  t.block_dim = static_cast<uint32_t>(std::max<int64_t>(1, std::min<int64_t>(hw.vector_cores, s.num_tokens)));
  return 2ull * t.chunk_bytes;
}

}  // namespace ms_atb_plan

#endif  // MS_ATB_PLAN_H_
