// Runs an Ascend C kernel on the CPU: every program of the launch (a vector core, or a group's AIC and two
// AIVs) in a thread of its own (ProgramThreads), one at a time (see CoreScheduler), over the global tensors the
// caller registers, with the per-core capacities of the hardware figures. A broken rule ends the launch; its
// message is kept for MsAtbAscendcLastError() and printed to stderr.
#ifndef MS_ATB_ASCENDC_SIM_RUNNER_H_
#define MS_ATB_ASCENDC_SIM_RUNNER_H_

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "kernel_operator.h"
#include "sim_sched.h"
#include "sim_threads.h"

namespace AscendC {

std::string &LastError();  // sim_runner.cc

struct GmTensor { void *data; uint64_t bytes; };

// Whether the kernel type the program's tiling key declared (or the kernel's default) is the launch's form.
inline void CheckKernelType(LaunchForm form) {
  const KernelMetaType t = Sim().declared_type;
  const bool ok = form == LaunchForm::kMix12 ? t == KERNEL_TYPE_MIX_AIC_1_2
                  : form == LaunchForm::kAicOnly ? (t == KERNEL_TYPE_AIC_ONLY || t == KERNEL_TYPE_MIX_AIC_1_0 ||
                                                   t == KERNEL_TYPE_UNDECLARED)
                                                 : (t == KERNEL_TYPE_AIV_ONLY || t == KERNEL_TYPE_MIX_AIV_1_0 ||
                                                    t == KERNEL_TYPE_UNDECLARED);
  SIM_REQUIRE(ok, "core type",
              std::string("tiling key ") + std::to_string(Sim().tiling_key) +
                  (form == LaunchForm::kMix12
                       ? " launched as 1 AIC : 2 AIV groups, but the kernel does not declare "
                         "KERNEL_TYPE_MIX_AIC_1_2 for it"
                       : " launched on one core type, but the kernel declares a mixed type for it"));
}

// launch() runs the kernel once for each program of the launch (Sim() says which). Returns 0, or 1 with
// LastError() set.
template <class Launch>
int RunCores(const char *op, uint32_t block_dim, uint64_t tiling_key, const CoreCapacity &capacity,
             const std::vector<GmTensor> &gm, Launch launch, LaunchForm form = LaunchForm::kAivOnly) {
  CoreScheduler sched(block_dim, form);
  ProgramThreads::Get().Run(sched.Programs().size(), [&](size_t p) {
    const CoreScheduler::Program prog = sched.Programs()[p];
    SimState &sim = Sim();
    sim.gm.clear();
    for (const auto &t : gm) sim.gm.push_back({static_cast<const uint8_t *>(t.data), t.bytes});
    sim.capacity = capacity;
    sim.block_num = block_dim;
    sim.block_idx = prog.group;
    sim.core_type = prog.type;
    sim.sub_block_idx = prog.sub;
    sim.sub_block_num = form == LaunchForm::kMix12 ? 2 : 1;
    sim.tiling_key = tiling_key;
    sim.declared_type = KERNEL_TYPE_UNDECLARED;
    sim.declared_by_key = false;
    sim.deferred_error.clear();
    sim.sync_all = [&sched, p](bool aiv_only) { sched.Yield(p, false, aiv_only); };
    sim.set_flag = [&sched, p](int mode, int flag) { sched.SetFlag(p, mode, flag); };
    sim.wait_flag = [&sched, p](int flag) { sched.WaitFlag(p, flag); };
    try {
      sched.WaitTurn(p);
      launch();
      if (!sim.deferred_error.empty())
        throw std::runtime_error(sim.deferred_error + " (core " + std::to_string(prog.group) + ")");
      CheckKernelType(form);
      sched.Yield(p, true);
    } catch (const CoreScheduler::Aborted &) {
    } catch (const std::exception &e) {
      sched.Fail(e.what() + (form == LaunchForm::kMix12 ? " (" + sched.Name(p) + ")" : std::string()));
    }
    sim.gm.clear();
    sim.deferred_error.clear();
    sim.sync_all = nullptr;
    sim.set_flag = nullptr;
    sim.wait_flag = nullptr;
  });
  sched.CheckLeftovers();
  if (sched.Error().empty()) return 0;
  LastError() = std::string(op) + ": " + sched.Error();
  std::fprintf(stderr, "ms_atb ascendc %s\n", LastError().c_str());
  return 1;
}

}  // namespace AscendC

#endif  // MS_ATB_ASCENDC_SIM_RUNNER_H_
