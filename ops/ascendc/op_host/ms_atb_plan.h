// Tiling plans of the ms_atb AscendC ops, computed from the shapes and the hardware figures alone
// (plain C++: the op_host tiling functions and the CPU verification call the same code).
//
// Hardware figures assumed for the Atlas 800I A2 (Ascend 910B) when the platform cannot be asked
// (on the NPU the tiling functions read them from the platform instead); sources in
// ops/ascendc/README.md: 20 AI cores (Cube), 40 vector cores, unified buffer 192 KiB per vector
// core, L1 512 KiB, L0A 64 KiB, L0B 64 KiB, L0C 128 KiB per AI core.
// A Cube launch (prefill chunks) is a mixed kernel: one block = one AI core group, its AIC (Cube) and two AIVs.
#ifndef MS_ATB_PLAN_H_
#define MS_ATB_PLAN_H_

#include <algorithm>
#include <cstdint>


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
constexpr uint32_t kAivPerGroup = 2;     // vector cores (AIV) per AI core group of a mixed launch

inline uint32_t Align(uint64_t bytes) { return static_cast<uint32_t>((bytes + kAlign - 1) / kAlign * kAlign); }

struct PagedAttentionShape {
  int64_t num_tokens, num_heads, num_kv_heads, head_dim, block_size, num_blocks, num_seqs, max_blocks;
  int64_t elem_bytes;        // 2: float16 or bfloat16 queries (and caches, unless int8)
  int64_t cache_elem_bytes;  // 2, or 1: int8 caches with float32 scales [NB, BS, KVH]
};

// The tile sizes, the bytes of each buffer one core of the kernel asks for, and the work split.
struct PagedAttentionPlan {
  uint32_t block_dim = 0, q_tile = 0, head_tile = 0, span = 0;
  uint32_t q_bytes = 0, kv_bytes = 0, out_bytes = 0, rows_f32_bytes = 0, kv_f32_bytes = 0, scores_bytes = 0,
           stats_bytes = 0, work_bytes = 0, p_bytes = 0, stage_bytes = 0;
  uint64_t ub_bytes = 0;  // 0: no tiling fits
  // Cube unit (prefill chunks of 16-bit caches): rows padded to whole fractals, L1 / L0 buffers.
  uint32_t cube = 0, rows_pad = 0, q_l1_bytes = 0, kv_l1_bytes = 0, p_l1_bytes = 0, q_l0a_bytes = 0, p_l0a_bytes = 0,
           kv_l0b_bytes = 0, s_l0c_bytes = 0, pv_l0c_bytes = 0;
  uint64_t l1_bytes = 0, l0a_bytes = 0, l0b_bytes = 0, l0c_bytes = 0;
  // Global-memory workspace: per core, the Cube <-> vector exchange (scores, probabilities, P x V); per
  // (work item, context split), one partial result (unnormalised rows, running max, sum).
  uint32_t kv_splits = 1, base_items = 0, ws_core_bytes = 0, partial_bytes = 0;
  uint64_t workspace_bytes = 0;
  uint32_t cores = 0;  // the blocks the launch may use: AI core groups with the Cube, vector cores without
};

inline uint32_t RoundUp16(uint64_t n) { return static_cast<uint32_t>((n + 15) / 16 * 16); }

// Unified-buffer bytes of one core: out (1 buffer), the accumulators and a float32 rows buffer, scores,
// 4 statistics vectors (m, l, new m, alpha) and 2 reduction scratch buffers; on the vector unit alone also
// q (1), K and V (2 buffers each: double buffering) and K and V spans in float32 (the rows buffer holds the
// scaled queries); with the Cube, the probabilities in the queries' type (the rows buffer holds P x V); with
// int8 caches, a float16 staging span (and, with the Cube, the K and V buffers and float32 spans of the
// vector unit alone: the AIVs widen the int8 rows for the Cube and hold the span's scales).
inline uint64_t PagedAttentionUb(PagedAttentionPlan &p, const PagedAttentionShape &s) {
  const uint64_t rows = uint64_t{p.q_tile} * p.head_tile, d = s.head_dim, span = p.span;
  p.out_bytes = Align(rows * d * s.elem_bytes);
  p.q_bytes = p.cube ? 0 : p.out_bytes;
  const bool reads_cache = !p.cube || s.cache_elem_bytes == 1;  // the Cube reads 16-bit caches itself
  p.kv_bytes = reads_cache ? Align(span * d * s.cache_elem_bytes) : 0;
  p.kv_f32_bytes = reads_cache ? Align(span * d * 4) : 0;
  p.rows_f32_bytes = Align(rows * d * 4);
  p.scores_bytes = Align(rows * span * 4);
  p.stats_bytes = Align(rows * 4);
  p.work_bytes = Align(std::max<uint64_t>(span, d) * 4);
  p.p_bytes = p.cube ? Align(rows * span * s.elem_bytes) : 0;
  p.stage_bytes = s.cache_elem_bytes == 1 ? Align(span * d * 2) : 0;
  return uint64_t{p.q_bytes} + 4ull * p.kv_bytes + p.out_bytes + 2ull * p.rows_f32_bytes + 2ull * p.kv_f32_bytes +
         p.scores_bytes + 4ull * p.stats_bytes + 2ull * p.work_bytes + p.p_bytes + p.stage_bytes;
}

// The Cube's buffers for the tiles: Q and P (A, rows_pad x D and rows_pad x span) in L1 and L0A, K and V
// (B, span x D each) in L1 and L0B, the scores and P x V (rows_pad x span and rows_pad x D, float32) in L0C.
// True when they fit the core's L1 / L0A / L0B / L0C.
inline bool CubeFits(PagedAttentionPlan &p, const PagedAttentionShape &s, const HardwareFigures &hw) {
  const uint64_t m = RoundUp16(uint64_t{p.q_tile} * p.head_tile), d = s.head_dim, span = p.span, e = s.elem_bytes;
  p.rows_pad = static_cast<uint32_t>(m);
  p.q_l1_bytes = p.q_l0a_bytes = Align(m * d * e);
  p.p_l1_bytes = p.p_l0a_bytes = Align(m * span * e);
  p.kv_l1_bytes = p.kv_l0b_bytes = Align(span * d * e);
  p.s_l0c_bytes = Align(m * span * 4);
  p.pv_l0c_bytes = Align(m * d * 4);
  p.l1_bytes = uint64_t{p.q_l1_bytes} + 2ull * p.kv_l1_bytes + p.p_l1_bytes;
  p.l0a_bytes = uint64_t{p.q_l0a_bytes} + p.p_l0a_bytes;
  p.l0b_bytes = 2ull * p.kv_l0b_bytes;
  p.l0c_bytes = uint64_t{p.s_l0c_bytes} + p.pv_l0c_bytes;
  // The group's exchange area: scores, P, P x V; with int8 caches also K and V widened to 16 bits.
  p.ws_core_bytes = Align(m * span * 4) + Align(m * span * e) + Align(m * d * 4) +
                    (s.cache_elem_bytes == 1 ? 2 * Align(span * d * e) : 0);
  return p.l1_bytes <= hw.l1_bytes && p.l0a_bytes <= hw.l0a_bytes && p.l0b_bytes <= hw.l0b_bytes &&
         p.l0c_bytes <= hw.l0c_bytes;
}

// The plan of a shape (ub_bytes 0 when none fits; then *why says which limit). Work item = (sequence,
// q_tile queries, KV head, head_tile heads of its group, one of kv_splits parts of the context); the cache
// is read in spans of `span` tokens with one online-softmax update per span. Largest head tile (a divisor
// of the group) first, then the largest query tile, then the longest span that fits the unified buffer
// (and, when the launch holds prefill chunks of a 16-bit cache, the Cube's buffers). When the work items
// are fewer than the cores, each item's context is split over several cores (kv_splits), whose partial
// results a second phase of the kernel combines.
inline PagedAttentionPlan PlanPagedAttention(const PagedAttentionShape &s, const HardwareFigures &hw,
                                             const char **why) {
  PagedAttentionPlan p;
  *why = "";
  if (s.num_kv_heads < 1 || s.num_heads % s.num_kv_heads != 0) { *why = "num_heads % num_kv_heads"; return p; }
  if ((s.head_dim * s.elem_bytes) % kAlign != 0 || (s.head_dim * s.cache_elem_bytes) % kAlign != 0) {
    *why = "head_dim * element bytes % 32";
    return p;
  }
  const int64_t group = s.num_heads / s.num_kv_heads;
  const int64_t max_context = std::max<int64_t>(1, s.max_blocks * s.block_size);
  const int64_t max_queries = std::max<int64_t>(1, s.num_tokens - std::max<int64_t>(s.num_seqs, 1) + 1);
  const int64_t span_max = std::min<int64_t>(kMaxSpan, (max_context + kTokenGrain - 1) / kTokenGrain * kTokenGrain);
  // A sequence with more than one query (a prefill chunk) needs T > B. In such a launch every item (decode ones
  // too, their rows padded to 16) goes through the Cube; int8 rows are widened to 16 bits (exact) by the AIVs.
  p.cube = s.num_tokens > std::max<int64_t>(s.num_seqs, 1) ? 1 : 0;
  for (int64_t head_tile = group; head_tile >= 1 && p.ub_bytes == 0; --head_tile) {
    if (group % head_tile) continue;
    p.head_tile = static_cast<uint32_t>(head_tile);
    for (int64_t q_tile = std::min<int64_t>(max_queries, kMaxQueryTile); q_tile >= 1 && p.ub_bytes == 0; q_tile /= 2) {
      p.q_tile = static_cast<uint32_t>(q_tile);
      for (int64_t span = span_max; span >= kTokenGrain; span -= kTokenGrain) {
        p.span = static_cast<uint32_t>(span);
        const uint64_t need = PagedAttentionUb(p, s);
        if (need <= hw.ub_bytes && (!p.cube || CubeFits(p, s, hw))) { p.ub_bytes = need; break; }
      }
    }
  }
  if (p.ub_bytes == 0) {
    *why = "unified buffer (or the Cube's L1 / L0): one query, one head and 16 cache tokens do not fit";
    return p;
  }
  // An upper bound on the work items over every split of T queries into B sequences.
  const int64_t seq_tiles = std::min<int64_t>(s.num_tokens, std::max<int64_t>(s.num_seqs, 1) + s.num_tokens / p.q_tile);
  const int64_t items = seq_tiles * s.num_kv_heads * (group / p.head_tile);
  p.cores = p.cube ? hw.cube_cores : hw.vector_cores;
  const int64_t spans = (max_context + p.span - 1) / p.span;
  p.kv_splits = static_cast<uint32_t>(items < p.cores ? std::max<int64_t>(1, std::min<int64_t>(p.cores / items, spans)) : 1);
  p.base_items = static_cast<uint32_t>(items);
  p.block_dim = static_cast<uint32_t>(std::max<int64_t>(1, std::min<int64_t>(p.cores, items * p.kv_splits)));
  p.partial_bytes = p.kv_splits > 1 ? Align(uint64_t{p.q_tile} * p.head_tile * s.head_dim * 4) + 2 * p.stats_bytes : 0;
  // Partials: one per (item, part), per AIV of a group in a mixed launch (each holds half of the item's rows).
  const uint64_t partials = uint64_t(items) * p.kv_splits * (p.cube ? kAivPerGroup : 1);
  p.workspace_bytes = uint64_t{p.block_dim} * p.ws_core_bytes + partials * p.partial_bytes;
  return p;
}

// The tiling data of a plan (TilingData: MsAtbPagedAttentionTilingData, through its setters).
template <class TilingData>
void StorePagedAttention(const PagedAttentionShape &s, const PagedAttentionPlan &p, TilingData &t) {
  t.set_num_tokens(s.num_tokens); t.set_num_heads(s.num_heads); t.set_num_kv_heads(s.num_kv_heads);
  t.set_head_dim(s.head_dim); t.set_block_size(s.block_size); t.set_num_blocks(s.num_blocks);
  t.set_num_seqs(s.num_seqs); t.set_max_blocks(s.max_blocks);
  t.set_block_dim(p.block_dim); t.set_q_tile(p.q_tile); t.set_head_tile(p.head_tile); t.set_span(p.span);
  t.set_q_bytes(p.q_bytes); t.set_kv_bytes(p.kv_bytes); t.set_out_bytes(p.out_bytes);
  t.set_rows_f32_bytes(p.rows_f32_bytes); t.set_kv_f32_bytes(p.kv_f32_bytes); t.set_scores_bytes(p.scores_bytes);
  t.set_stats_bytes(p.stats_bytes); t.set_work_bytes(p.work_bytes); t.set_p_bytes(p.p_bytes);
  t.set_stage_bytes(p.stage_bytes); t.set_cube(p.cube); t.set_rows_pad(p.rows_pad);
  t.set_q_l1_bytes(p.q_l1_bytes); t.set_kv_l1_bytes(p.kv_l1_bytes); t.set_p_l1_bytes(p.p_l1_bytes);
  t.set_q_l0a_bytes(p.q_l0a_bytes); t.set_p_l0a_bytes(p.p_l0a_bytes); t.set_kv_l0b_bytes(p.kv_l0b_bytes);
  t.set_s_l0c_bytes(p.s_l0c_bytes); t.set_pv_l0c_bytes(p.pv_l0c_bytes); t.set_kv_splits(p.kv_splits);
  t.set_ws_core_bytes(p.ws_core_bytes); t.set_partial_bytes(p.partial_bytes);
  t.set_quant(s.cache_elem_bytes == 1 ? 1 : 0); t.set_ws_bytes(static_cast<uint32_t>(p.workspace_bytes));
}

struct ReshapeAndCacheShape {
  int64_t num_tokens, num_kv_heads, head_dim, num_blocks, block_size, elem_bytes;
  int64_t cache_elem_bytes;  // elem_bytes, or 1: int8 caches, quantised on the write
};

struct ReshapeAndCachePlan {
  uint32_t block_dim = 0, chunk_elems = 0, chunk_bytes = 0;
  // int8 caches: the float32, int32 and float16 steps of a chunk, its int8 values, its heads' scales.
  uint32_t f32_bytes = 0, i32_bytes = 0, half_bytes = 0, int8_bytes = 0, scale_bytes = 0, work_bytes = 0;
  uint64_t ub_bytes = 0;  // 0: no tiling fits
};

// Each core copies the K and V rows of every block_dim-th token through two staging buffers of
// chunk_elems elements; a row larger than a buffer is copied in equal chunks. An int8 cache takes whole
// heads per chunk: each head's D values are quantised together (scale = max|x| / 127).
inline ReshapeAndCachePlan PlanReshapeAndCache(const ReshapeAndCacheShape &s, const HardwareFigures &hw,
                                               const char **why) {
  ReshapeAndCachePlan p;
  *why = "";
  const int64_t row = s.num_kv_heads * s.head_dim;
  if ((s.head_dim * s.elem_bytes) % kAlign != 0 || (s.head_dim * s.cache_elem_bytes) % kAlign != 0) {
    *why = "head_dim * element bytes % 32";
    return p;
  }
  p.block_dim = static_cast<uint32_t>(std::max<int64_t>(1, std::min<int64_t>(hw.vector_cores, s.num_tokens)));
  if (s.cache_elem_bytes == s.elem_bytes) {
    const int64_t grain = kAlign / s.elem_bytes;
    const int64_t per_buffer = static_cast<int64_t>(hw.ub_bytes / 2) / kAlign * kAlign / s.elem_bytes;
    int64_t chunk = std::min<int64_t>(row, per_buffer) / grain * grain;
    while (row % chunk) chunk -= grain;
    p.chunk_elems = static_cast<uint32_t>(chunk);
    p.chunk_bytes = Align(chunk * s.elem_bytes);
    p.ub_bytes = 2ull * p.chunk_bytes;
    return p;
  }
  for (int64_t heads = s.num_kv_heads; heads >= 1; --heads) {
    if (s.num_kv_heads % heads) continue;
    const int64_t chunk = heads * s.head_dim;
    p.chunk_elems = static_cast<uint32_t>(chunk);
    p.chunk_bytes = Align(chunk * s.elem_bytes);
    p.f32_bytes = Align(chunk * 4);
    p.i32_bytes = Align(chunk * 4);
    p.half_bytes = Align(chunk * 2);
    p.int8_bytes = Align(chunk);
    p.scale_bytes = Align(heads * 4);
    p.work_bytes = Align(s.head_dim * 4);
    const uint64_t need = 2ull * p.chunk_bytes + p.f32_bytes + p.i32_bytes + p.half_bytes + 2ull * p.int8_bytes +
                          2ull * p.scale_bytes + 2ull * p.work_bytes;
    if (need <= hw.ub_bytes) { p.ub_bytes = need; return p; }
  }
  *why = "unified buffer: one head's row does not fit";
  return p;
}

template <class TilingData>
void StoreReshapeAndCache(const ReshapeAndCacheShape &s, const ReshapeAndCachePlan &p, TilingData &t) {
  t.set_num_tokens(s.num_tokens); t.set_row_elems(s.num_kv_heads * s.head_dim);
  t.set_num_slots(s.num_blocks * s.block_size); t.set_block_dim(p.block_dim);
  t.set_chunk_elems(p.chunk_elems); t.set_chunk_bytes(p.chunk_bytes);
  t.set_head_dim(s.head_dim); t.set_num_kv_heads(s.num_kv_heads); t.set_quant(s.cache_elem_bytes == 1 ? 1 : 0);
  t.set_f32_bytes(p.f32_bytes); t.set_i32_bytes(p.i32_bytes); t.set_half_bytes(p.half_bytes);
  t.set_int8_bytes(p.int8_bytes); t.set_scale_bytes(p.scale_bytes); t.set_work_bytes(p.work_bytes);
}

}  // namespace ms_atb_plan

#endif  // MS_ATB_PLAN_H_
