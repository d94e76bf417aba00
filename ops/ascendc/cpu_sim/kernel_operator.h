// The Ascend C API subset that ops/ascendc/op_kernel uses, implemented for the CPU (see sim_core.h for
// the rules it enforces). Kernels include it under the real header's name and compile unchanged with g++.
#ifndef MS_ATB_ASCENDC_KERNEL_OPERATOR_H_
#define MS_ATB_ASCENDC_KERNEL_OPERATOR_H_

#include "sim_core.h"
#include "sim_mix.h"
#include "sim_ops.h"
#include "sim_cube.h"
#include "sim_tensor.h"

// The tiling struct of a kernel, copied from the tiling argument.
#define GET_TILING_DATA_WITH_STRUCT(Struct, name, tiling) \
  Struct name;                                            \
  std::memcpy(&name, tiling, sizeof(Struct))

#endif  // MS_ATB_ASCENDC_KERNEL_OPERATOR_H_
