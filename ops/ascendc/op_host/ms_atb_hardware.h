// The hardware figures of the chip the op runs on, read from CANN's platform information (the tiling
// falls back on the assumed Atlas 800I A2 figures of ms_atb_plan.h for any the platform does not give).
#ifndef MS_ATB_HARDWARE_H_
#define MS_ATB_HARDWARE_H_

#include "ms_atb_plan.h"
#include "tiling/platform/platform_ascendc.h"

namespace ms_atb_plan {

inline HardwareFigures PlatformFigures(gert::TilingContext *context) {
  HardwareFigures hw = AssumedAtlas800IA2();
  auto platform = platform_ascendc::PlatformAscendC(context->GetPlatformInfo());
  if (platform.GetCoreNumAiv() > 0) hw.vector_cores = platform.GetCoreNumAiv();
  if (platform.GetCoreNumAic() > 0) hw.cube_cores = platform.GetCoreNumAic();
  uint64_t bytes = 0;
  platform.GetCoreMemSize(platform_ascendc::CoreMemType::UB, bytes);
  if (bytes > 0) hw.ub_bytes = bytes;
  bytes = 0;
  platform.GetCoreMemSize(platform_ascendc::CoreMemType::L1, bytes);
  if (bytes > 0) hw.l1_bytes = bytes;
  bytes = 0;
  platform.GetCoreMemSize(platform_ascendc::CoreMemType::L0_A, bytes);
  if (bytes > 0) hw.l0a_bytes = bytes;
  bytes = 0;
  platform.GetCoreMemSize(platform_ascendc::CoreMemType::L0_B, bytes);
  if (bytes > 0) hw.l0b_bytes = bytes;
  bytes = 0;
  platform.GetCoreMemSize(platform_ascendc::CoreMemType::L0_C, bytes);
  if (bytes > 0) hw.l0c_bytes = bytes;
  return hw;
}

// Bytes of workspace the AscendC runtime itself needs (the kernels' own part comes after it).
inline size_t SystemWorkspace(gert::TilingContext *context) {
  return platform_ascendc::PlatformAscendC(context->GetPlatformInfo()).GetLibApiWorkSpaceSize();
}

}  // namespace ms_atb_plan

#endif  // MS_ATB_HARDWARE_H_
