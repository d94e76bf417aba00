// Tiling data of MsAtbReshapeAndCache: filled by the op_host tiling function, read by the kernel.
#ifndef MS_ATB_RESHAPE_AND_CACHE_TILING_H_
#define MS_ATB_RESHAPE_AND_CACHE_TILING_H_

#include "register/tilingdata_base.h"

namespace optiling {
BEGIN_TILING_DATA_DEF(MsAtbReshapeAndCacheTilingData)
TILING_DATA_FIELD_DEF(uint32_t, num_tokens);   // T
TILING_DATA_FIELD_DEF(uint32_t, row_elems);    // KVH * D: one token's K (or V) row
TILING_DATA_FIELD_DEF(uint32_t, num_slots);    // NB * BS
TILING_DATA_FIELD_DEF(uint32_t, block_dim);    // cores the tokens are dealt to
TILING_DATA_FIELD_DEF(uint32_t, chunk_elems);  // elements per copy through the unified buffer
TILING_DATA_FIELD_DEF(uint32_t, chunk_bytes);  // bytes of each of the two staging buffers
TILING_DATA_FIELD_DEF(uint32_t, head_dim);     // D
TILING_DATA_FIELD_DEF(uint32_t, num_kv_heads); // KVH
TILING_DATA_FIELD_DEF(uint32_t, quant);        // 1: int8 caches, quantised per (token, KV head) row
TILING_DATA_FIELD_DEF(uint32_t, f32_bytes);    // int8 caches: bytes of the quantisation buffers
TILING_DATA_FIELD_DEF(uint32_t, i32_bytes);
TILING_DATA_FIELD_DEF(uint32_t, half_bytes);
TILING_DATA_FIELD_DEF(uint32_t, int8_bytes);
TILING_DATA_FIELD_DEF(uint32_t, scale_bytes);
TILING_DATA_FIELD_DEF(uint32_t, work_bytes);
END_TILING_DATA_DEF;

REGISTER_TILING_DATA_CLASS(MsAtbReshapeAndCache, MsAtbReshapeAndCacheTilingData)
}  // namespace optiling

#endif  // MS_ATB_RESHAPE_AND_CACHE_TILING_H_
