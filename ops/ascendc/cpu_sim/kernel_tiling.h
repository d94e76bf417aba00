// The kernels' view of their tiling structs on the CPU: the op_host definitions, named without their
// namespace, as CANN's build generates them for op_kernel. Force-included into every kernel source.
#ifndef MS_ATB_ASCENDC_SIM_KERNEL_TILING_H_
#define MS_ATB_ASCENDC_SIM_KERNEL_TILING_H_

#include "ms_atb_paged_attention_tiling.h"
#include "ms_atb_reshape_and_cache_tiling.h"

using optiling::MsAtbPagedAttentionTilingData;
using optiling::MsAtbReshapeAndCacheTilingData;

#endif  // MS_ATB_ASCENDC_SIM_KERNEL_TILING_H_
