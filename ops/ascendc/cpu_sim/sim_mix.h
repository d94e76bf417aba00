// CPU implementation of the Ascend C API for mixed (Cube + vector) kernels of the Atlas A2: the core-type
// tests ASCEND_IS_AIC / ASCEND_IS_AIV, the kernel-type declarations and the cross-core flags. Our own code,
// written from the public documentation of the API's names and semantics.
//
// CrossCoreSetFlag<modeId, pipe>(flagId) / CrossCoreWaitFlag<modeId, pipe>(flagId): each program (AIC or AIV)
// holds one counter per flag id (0..10); a wait blocks while its counter is 0, then takes 1. Modes:
//   0: among all cores of the caller's type: once every one of them has set the flag, each counter rises;
//   1: between the two AIVs of a group (once both have set it, both counters rise);
//   2: between the AIC and the AIVs of a group: the AIC's set raises both AIVs' counters; once both AIVs have
//      set it, the AIC's counter rises.
// The runner (sim_sched.h) enforces the rule "cross-core flag": ids in 0..10, modes 0..2, no set on PIPE_S / PIPE_ALL,
// at most 15 sets pending on one counter, mode 1 and 2 only in a mixed launch, every wait satisfied (a wait
// that no program can still satisfy is reported as a deadlock naming the flag), and no counter or half-set
// pair left over when the launch ends.
#ifndef MS_ATB_ASCENDC_SIM_MIX_H_
#define MS_ATB_ASCENDC_SIM_MIX_H_

#include <string>

#include "sim_core.h"

// Real kernels test these as `if ASCEND_IS_AIC { ... }`: one branch per core type of a mixed kernel.
#define ASCEND_IS_AIC (::AscendC::Sim().core_type == ::AscendC::CoreType::kAic)
#define ASCEND_IS_AIV (::AscendC::Sim().core_type == ::AscendC::CoreType::kAiv)

// The kernel type of every tiling key, or of one; statements inside the kernel function.
#define KERNEL_TASK_TYPE_DEFAULT(type) ::AscendC::DeclareKernelType(-1, ::AscendC::type)
#define KERNEL_TASK_TYPE(key, type) ::AscendC::DeclareKernelType(key, ::AscendC::type)

namespace AscendC {

constexpr int kCrossCoreFlags = 11;       // flag ids 0..10 on the Atlas A2
constexpr int kCrossCoreMaxPending = 15;  // sets one counter holds before a wait takes them

inline void DeclareKernelType(int64_t key, KernelMetaType type) {
  SimState &sim = Sim();
  if (key < 0) {
    if (!sim.declared_by_key) sim.declared_type = type;
  } else if (static_cast<uint64_t>(key) == sim.tiling_key) {
    sim.declared_type = type;
    sim.declared_by_key = true;
  }
}

namespace detail {
inline void CheckFlag(int mode, int flag, pipe_t pipe, bool set, const char *op) {
  SIM_REQUIRE(flag >= 0 && flag < kCrossCoreFlags, "cross-core flag",
              std::string(op) + " flag id " + std::to_string(flag) + ": the Atlas A2 has ids 0..10");
  SIM_REQUIRE(mode >= 0 && mode <= 2, "cross-core flag",
              std::string(op) + " mode " + std::to_string(mode) + ": modes are 0..2");
  SIM_REQUIRE(!set || (pipe != PIPE_S && pipe != PIPE_ALL), "cross-core flag",
              std::string(op) + " on PIPE_S / PIPE_ALL: the flag is set from a data pipe (PIPE_MTE3, PIPE_FIX, ...)");
}
}  // namespace detail

template <uint8_t modeId, pipe_t pipe>
inline void CrossCoreSetFlag(uint16_t flagId) {
  detail::CheckFlag(modeId, flagId, pipe, true, "CrossCoreSetFlag");
  SIM_REQUIRE(modeId != 1 || Sim().core_type == CoreType::kAiv, "cross-core flag",
              "CrossCoreSetFlag mode 1 synchronises the AIVs of a group; called on an AIC");
  RequireHardSync(Sim().declared_type, "CrossCoreSetFlag");
  SIM_REQUIRE(static_cast<bool>(Sim().set_flag), "cross-core flag", "CrossCoreSetFlag outside a launch");
  Sim().set_flag(modeId, flagId);
}

template <uint8_t modeId = 0, pipe_t pipe = PIPE_S>
inline void CrossCoreWaitFlag(uint16_t flagId) {
  detail::CheckFlag(modeId, flagId, pipe, false, "CrossCoreWaitFlag");
  SIM_REQUIRE(static_cast<bool>(Sim().wait_flag), "cross-core flag", "CrossCoreWaitFlag outside a launch");
  Sim().wait_flag(flagId);
}

}  // namespace AscendC

#endif  // MS_ATB_ASCENDC_SIM_MIX_H_
