// Tiling data of MsAtbPagedAttention: filled by the op_host tiling function, read by the kernel.
#ifndef MS_ATB_PAGED_ATTENTION_TILING_H_
#define MS_ATB_PAGED_ATTENTION_TILING_H_

#include "register/tilingdata_base.h"

namespace optiling {
BEGIN_TILING_DATA_DEF(MsAtbPagedAttentionTilingData)
TILING_DATA_FIELD_DEF(uint32_t, num_tokens);     // T: query rows
TILING_DATA_FIELD_DEF(uint32_t, num_heads);      // H
TILING_DATA_FIELD_DEF(uint32_t, num_kv_heads);   // KVH
TILING_DATA_FIELD_DEF(uint32_t, head_dim);       // D
TILING_DATA_FIELD_DEF(uint32_t, block_size);     // BS
TILING_DATA_FIELD_DEF(uint32_t, num_blocks);     // NB
TILING_DATA_FIELD_DEF(uint32_t, num_seqs);       // B
TILING_DATA_FIELD_DEF(uint32_t, max_blocks);     // MAXB: block_tables' width
TILING_DATA_FIELD_DEF(uint32_t, block_dim);      // cores the work items are dealt to
TILING_DATA_FIELD_DEF(uint32_t, q_tile);         // queries of one sequence per work item
TILING_DATA_FIELD_DEF(uint32_t, head_tile);      // query heads of one KV head's group per work item
TILING_DATA_FIELD_DEF(uint32_t, span);           // cache tokens per online-softmax step
TILING_DATA_FIELD_DEF(uint32_t, q_bytes);        // unified-buffer bytes of each buffer, as InitBuffer asks
TILING_DATA_FIELD_DEF(uint32_t, kv_bytes);
TILING_DATA_FIELD_DEF(uint32_t, out_bytes);
TILING_DATA_FIELD_DEF(uint32_t, rows_f32_bytes);
TILING_DATA_FIELD_DEF(uint32_t, kv_f32_bytes);
TILING_DATA_FIELD_DEF(uint32_t, scores_bytes);
TILING_DATA_FIELD_DEF(uint32_t, stats_bytes);
TILING_DATA_FIELD_DEF(uint32_t, work_bytes);
TILING_DATA_FIELD_DEF(uint32_t, p_bytes);        // probabilities in the queries' type (Cube items)
TILING_DATA_FIELD_DEF(uint32_t, stage_bytes);    // float16 staging span (int8 caches)
TILING_DATA_FIELD_DEF(uint32_t, cube);           // 1: prefill chunks multiply on the Cube unit
TILING_DATA_FIELD_DEF(uint32_t, rows_pad);       // rows of a work item, rounded up to whole fractals (16)
TILING_DATA_FIELD_DEF(uint32_t, q_l1_bytes);     // L1 / L0A / L0B / L0C bytes of each Cube buffer
TILING_DATA_FIELD_DEF(uint32_t, kv_l1_bytes);
TILING_DATA_FIELD_DEF(uint32_t, p_l1_bytes);
TILING_DATA_FIELD_DEF(uint32_t, q_l0a_bytes);
TILING_DATA_FIELD_DEF(uint32_t, p_l0a_bytes);
TILING_DATA_FIELD_DEF(uint32_t, kv_l0b_bytes);
TILING_DATA_FIELD_DEF(uint32_t, s_l0c_bytes);
TILING_DATA_FIELD_DEF(uint32_t, pv_l0c_bytes);
TILING_DATA_FIELD_DEF(uint32_t, kv_splits);      // parts of one item's context, on as many cores
TILING_DATA_FIELD_DEF(uint32_t, ws_core_bytes);  // workspace bytes of one core's Cube <-> vector exchange
TILING_DATA_FIELD_DEF(uint32_t, partial_bytes);  // workspace bytes of one partial result
TILING_DATA_FIELD_DEF(uint32_t, quant);          // 1: int8 caches with float32 scales
TILING_DATA_FIELD_DEF(uint32_t, ws_bytes);       // workspace bytes of the kernel (exchange and partials)
END_TILING_DATA_DEF;

REGISTER_TILING_DATA_CLASS(MsAtbPagedAttention, MsAtbPagedAttentionTilingData)
}  // namespace optiling

#endif  // MS_ATB_PAGED_ATTENTION_TILING_H_
