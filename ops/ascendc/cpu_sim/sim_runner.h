// Runs an Ascend C kernel on the CPU: one core index after another, over the global tensors the
// caller registers, with the per-core capacities of the hardware figures. A broken rule ends the
// launch; its message is kept for MsAtbAscendcLastError() and printed to stderr.
#ifndef MS_ATB_ASCENDC_SIM_RUNNER_H_
#define MS_ATB_ASCENDC_SIM_RUNNER_H_

#include <cstdio>
#include <string>
#include <vector>

#include "kernel_operator.h"

namespace AscendC {

std::string &LastError();  // sim_runner.cc

struct GmTensor { void *data; uint64_t bytes; };

// launch() runs the kernel once for the core Sim().block_idx. Returns 0, or 1 with LastError() set.
template <class Launch>
int RunCores(const char *op, uint32_t block_dim, uint64_t tiling_key, const CoreCapacity &capacity,
             const std::vector<GmTensor> &gm, Launch launch) {
  SimState &sim = Sim();
  sim.gm.clear();
  for (const auto &t : gm) sim.gm.push_back({static_cast<const uint8_t *>(t.data), t.bytes});
  sim.capacity = capacity;
  sim.block_num = block_dim;
  sim.tiling_key = tiling_key;
  int status = 0;
  try {
    for (uint32_t i = 0; i < block_dim; ++i) {
      sim.block_idx = i;
      sim.deferred_error.clear();
      launch();
      if (!sim.deferred_error.empty())
        throw std::runtime_error(sim.deferred_error + " (core " + std::to_string(i) + ")");
    }
  } catch (const std::exception &e) {
    LastError() = std::string(op) + ": " + e.what();
    std::fprintf(stderr, "ms_atb ascendc %s\n", LastError().c_str());
    status = 1;
  }
  sim.gm.clear();
  sim.deferred_error.clear();
  return status;
}

}  // namespace AscendC

#endif  // MS_ATB_ASCENDC_SIM_RUNNER_H_
