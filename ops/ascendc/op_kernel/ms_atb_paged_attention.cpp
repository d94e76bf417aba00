// MsAtbPagedAttention: causal GQA attention of decode tokens and prefill chunks over the paged cache.
//   query [T, H, D]; key_cache, value_cache [NB, BS, KVH, D]; block_tables [B, MAXB] int32;
//   context_lens [B] int32; query_start_loc [B + 1] int32; scale [1] float32;
//   key_scale_cache, value_scale_cache [NB, BS, KVH] float32 (int8 caches only) -> out [T, H, D].
// Sequence b owns query rows query_start_loc[b]:query_start_loc[b+1], the last tokens of its
// context_lens[b] tokens; rows owned by no sequence are written zero. float16 / bfloat16 queries; caches
// of the same type or int8 (cached value = int8 value x its token and head's scale, dequantised as read).
// Work item = (sequence, q_tile queries, KV head, head_tile heads of its group, part `split` of the
// context); core i takes items i, i + block_dim, ... One online-softmax update per span of cache tokens.
// Units: a launch holding prefill chunks is a mixed kernel (tiling keys 4 to 7,
// KERNEL_TYPE_MIX_AIC_1_2: block_dim groups of one AIC and two AIVs): the AIC multiplies Q x K^T and P x V of
// every item on the Cube unit (Mmad, through L1 and L0A / L0B / L0C; decode items padded to 16 rows), the AIVs
// take the softmax, the two handing tiles over through the group's workspace under CrossCoreSetFlag /
// CrossCoreWaitFlag (ms_atb_paged_attention_cube.h); int8 rows reach the Cube widened to 16 bits by the AIVs,
// their scales applied to the scores and to P. Decode-only launches run on the vector cores alone (float32; KERNEL_TYPE_MIX_AIV_1_0: vector cores with the hardware SyncAll).
// Context split (kv_splits > 1): each part writes its unnormalised rows, running max and sum to the
// workspace; after SyncAll, the core of each item merges its parts (a second phase of the same launch).
#include "kernel_operator.h"
#include "ms_atb_paged_attention_kernel.h"

using namespace AscendC;

// Tiling key 0: float16; 1: bfloat16; 2: float16 queries, int8 caches; 3: bfloat16 queries, int8 caches (vector
// cores); 4 to 7: the same four with prefill chunks (mixed: the Cube and the vector cores).
extern "C" __global__ __aicore__ void ms_atb_paged_attention(GM_ADDR query, GM_ADDR key_cache, GM_ADDR value_cache,
                                                             GM_ADDR block_tables, GM_ADDR context_lens,
                                                             GM_ADDR query_start_loc, GM_ADDR scale,
                                                             GM_ADDR key_scale_cache, GM_ADDR value_scale_cache,
                                                             GM_ADDR out, GM_ADDR workspace, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0);
  KERNEL_TASK_TYPE(4, KERNEL_TYPE_MIX_AIC_1_2);
  KERNEL_TASK_TYPE(5, KERNEL_TYPE_MIX_AIC_1_2);
  KERNEL_TASK_TYPE(6, KERNEL_TYPE_MIX_AIC_1_2);
  KERNEL_TASK_TYPE(7, KERNEL_TYPE_MIX_AIC_1_2);
  GET_TILING_DATA_WITH_STRUCT(MsAtbPagedAttentionTilingData, td, tiling);
  GM_ADDR user_workspace = AscendC::GetUserWorkspace(workspace);
#define MS_ATB_RUN(T, C)                                                                                      \
  {                                                                                                           \
    ms_atb_kernel::PagedAttentionKernel<T, C> op;                                                             \
    op.Init(query, key_cache, value_cache, block_tables, context_lens, query_start_loc, scale, key_scale_cache, \
            value_scale_cache, out, user_workspace, td);                                                      \
    op.Process();                                                                                             \
  }
  if (TILING_KEY_IS(0)) MS_ATB_RUN(half, half)
  else if (TILING_KEY_IS(1)) MS_ATB_RUN(bfloat16_t, bfloat16_t)
  else if (TILING_KEY_IS(2)) MS_ATB_RUN(half, int8_t)
  else if (TILING_KEY_IS(3)) MS_ATB_RUN(bfloat16_t, int8_t)
  else if (TILING_KEY_IS(4)) MS_ATB_RUN(half, half)
  else if (TILING_KEY_IS(5)) MS_ATB_RUN(bfloat16_t, bfloat16_t)
  else if (TILING_KEY_IS(6)) MS_ATB_RUN(half, int8_t)
  else if (TILING_KEY_IS(7)) MS_ATB_RUN(bfloat16_t, int8_t)
#undef MS_ATB_RUN
}
