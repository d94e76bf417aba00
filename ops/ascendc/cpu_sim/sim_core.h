// CPU implementation of the Ascend C API subset used by ops/ascendc/op_kernel: rules, element types,
// the registry of global memory and the per-core state. Our own code, written from the public
// documentation of the API's names and signatures; it shares no code with CANN.
//
// Rules enforced (a violation throws RuleViolation; the runner reports it as the kernel's error):
//   "global memory access"  : DataCopy and GlobalTensor's GetValue/SetValue stay inside their tensor and the
//                             tensors the runner registered (a raw pointer a kernel dereferences is not seen)
//   "copy alignment"         : DataCopy lengths, strides and addresses are whole 32-byte blocks
//   "vector operand alignment": vector instructions start on a 32-byte boundary of local memory
//   "capacity"               : the InitBuffer sizes of one core fit its unified buffer / L1 / L0A / L0B / L0C
//   "queue discipline"       : AllocTensor within the queue's depth, EnQue/DeQue paired, every tensor freed
//   "use after FreeTensor"   : a local tensor is not used once freed (nor while it sits in a queue)
//   "local bounds"           : an access stays inside its local tensor
//   "core type"              : Cube work (L1 / L0 buffers, Mmad, LoadData, Fixpipe) runs on an AIC, vector
//                             work (unified buffer, vector instructions) on an AIV; a launch's form matches
//                             the kernel type its tiling key declares
//   "cross-core flag"        : CrossCoreSetFlag / CrossCoreWaitFlag (sim_mix.h) pair up; a wait no program can
//                             still satisfy is a deadlock, reported with its flag
#ifndef MS_ATB_ASCENDC_SIM_CORE_H_
#define MS_ATB_ASCENDC_SIM_CORE_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#define __aicore__
#define __global__
#define __gm__
#define GM_ADDR uint8_t *

namespace AscendC {

class RuleViolation : public std::runtime_error {
 public:
  RuleViolation(const std::string &rule, const std::string &detail)
      : std::runtime_error("Ascend C rule \"" + rule + "\" broken: " + detail) {}
};

// Checks a rule of the API; detail (an expression giving a std::string) is built only when the rule is broken,
// since the checks run on every instruction of a kernel.
#define SIM_REQUIRE(ok, rule, detail)                                     \
  do {                                                                    \
    if (__builtin_expect(!(ok), 0)) throw ::AscendC::RuleViolation(rule, detail); \
  } while (0)

constexpr uint32_t kBlockBytes = 32;  // one data block: the unit of copies and vector addresses

// Per-core capacities (bytes). The runner sets them from the tiling's hardware figures.
struct CoreCapacity {
  uint64_t ub = 192 * 1024, l1 = 512 * 1024, l0a = 64 * 1024, l0b = 64 * 1024, l0c = 128 * 1024;
};

// The two core types of an Atlas A2 AI core group: one Cube core (AIC) and two vector cores (AIV).
enum class CoreType { kAic, kAiv };
inline const char *CoreTypeName(CoreType t) { return t == CoreType::kAic ? "AIC" : "AIV"; }

// Kernel types (KERNEL_TASK_TYPE / KERNEL_TASK_TYPE_DEFAULT): which cores a launch of a tiling key starts.
enum KernelMetaType {
  KERNEL_TYPE_AIV_ONLY, KERNEL_TYPE_AIC_ONLY, KERNEL_TYPE_MIX_AIV_1_0, KERNEL_TYPE_MIX_AIC_1_0,
  KERNEL_TYPE_MIX_AIC_1_1, KERNEL_TYPE_MIX_AIC_1_2, KERNEL_TYPE_AICORE, KERNEL_TYPE_VECTORCORE,
  KERNEL_TYPE_MIX_AICORE, KERNEL_TYPE_MIX_VECTOR_CORE, KERNEL_TYPE_MAX, KERNEL_TYPE_UNDECLARED
};
// Hardware synchronisation across cores (SyncAll, CrossCoreSetFlag) needs a kernel type with "hard sync": the
// MIX types; a plain AIV_ONLY / AIC_ONLY declaration forbids it.
inline void RequireHardSync(KernelMetaType declared, const char *what) {
  if (declared == KERNEL_TYPE_AIV_ONLY || declared == KERNEL_TYPE_AIC_ONLY)
    throw RuleViolation("core type", std::string(what) + " needs a kernel type with hardware sync (KERNEL_TYPE_MIX_AIV_1_0, "
                                     "KERNEL_TYPE_MIX_AIC_1_0 or KERNEL_TYPE_MIX_AIC_1_2), not " +
                                     (declared == KERNEL_TYPE_AIV_ONLY ? "KERNEL_TYPE_AIV_ONLY" : "KERNEL_TYPE_AIC_ONLY"));
}

// State of the simulated machine: the core running now and the global-memory tensors it may touch.
struct SimState {
  struct Region { const uint8_t *base; uint64_t bytes; };
  std::vector<Region> gm;
  CoreCapacity capacity;
  int64_t block_idx = 0, block_num = 1;
  uint64_t tiling_key = 0;
  std::string deferred_error;  // a rule broken in a destructor, raised by the runner after the core returns
  std::function<void(bool aiv_only)> sync_all;  // the runner's barrier across the cores of the launch
  // The program running on this thread: its core type, its AIV index in the group (0 on an AIC), the AIVs
  // per group (2 in a mixed launch, 1 otherwise), and the kernel type its tiling key declared.
  CoreType core_type = CoreType::kAiv;
  int64_t sub_block_idx = 0, sub_block_num = 1;
  KernelMetaType declared_type = KERNEL_TYPE_UNDECLARED;
  bool declared_by_key = false;
  std::function<void(int mode, int flag)> set_flag;  // the runner's cross-core flags (sim_mix.h)
  std::function<void(int flag)> wait_flag;
};
inline SimState &Sim() {
  static thread_local SimState state;
  return state;
}

// The registered region holding [p, p + bytes), and p's offset in it; a RuleViolation otherwise.
inline const SimState::Region &GmRegion(const void *p, uint64_t bytes, uint64_t *offset) {
  const uint8_t *q = static_cast<const uint8_t *>(p);
  for (const auto &r : Sim().gm)
    if (q >= r.base && q + bytes <= r.base + r.bytes) {
      *offset = static_cast<uint64_t>(q - r.base);
      return r;
    }
  throw RuleViolation("global memory access", "an access of " + std::to_string(bytes) +
                                                  " bytes outside every global tensor of the kernel");
}

// AIC: the group's index in [0, GetBlockNum()); AIV: group * 2 + its index in the group, in [0, 2 * GetBlockNum())
// in a mixed 1:2 launch.
inline int64_t GetBlockIdx() {
  return Sim().core_type == CoreType::kAic ? Sim().block_idx : Sim().block_idx * Sim().sub_block_num + Sim().sub_block_idx;
}
inline int64_t GetSubBlockIdx() { return Sim().sub_block_idx; }
inline int64_t GetSubBlockNum() { return Sim().sub_block_num; }
inline int64_t GetTaskRatio() { return Sim().sub_block_num; }

// Stops the program unless it runs on core type `type`; `what` names the work.
inline void RequireCore(CoreType type, const char *what, const char *what_more = "") {
  if (__builtin_expect(Sim().core_type != type, 0))
    throw RuleViolation("core type", std::string(what) + what_more + " runs on the " + CoreTypeName(type) +
                                         ", called on an " + CoreTypeName(Sim().core_type));
}
// The kernel's own part of the workspace argument (the runner passes only that part).
inline uint8_t *GetUserWorkspace(uint8_t *workspace) { return workspace; }
inline int64_t GetBlockNum() { return Sim().block_num; }
inline bool TilingKeyIs(uint64_t key) { return Sim().tiling_key == key; }
#define TILING_KEY_IS(k) (::AscendC::TilingKeyIs(k))

// ---- 16-bit floating types stored as bits, converted as the hardware does (round to nearest even) ----
inline float BitsToFloat(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t FloatToBits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float HalfBitsToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return BitsToFloat(sign);
    float f = std::ldexp(static_cast<float>(man), -24);  // subnormal: man * 2^-24, exact
    return sign ? -f : f;
  }
  if (exp == 31) return BitsToFloat(sign | 0x7f800000u | (man << 13));
  return BitsToFloat(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t FloatToHalfBits(float x) {  // round to nearest even; overflow to infinity
  uint32_t u = FloatToBits(x), sign = (u >> 16) & 0x8000u, fexp = (u >> 23) & 0xff, man = u & 0x7fffffu;
  if (fexp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (man ? 0x200u : 0));
  int32_t exp = static_cast<int32_t>(fexp) - 112;
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    man |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (man >> 13), rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<uint16_t>(h);
}

inline uint16_t FloatToBf16Bits(float x) {  // round to nearest even; NaN stays NaN
  uint32_t u = FloatToBits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

struct half {
  uint16_t bits = 0;
  half() = default;
  explicit half(float f) : bits(FloatToHalfBits(f)) {}
  explicit operator float() const { return HalfBitsToFloat(bits); }
};
struct bfloat16_t {
  uint16_t bits = 0;
  bfloat16_t() = default;
  explicit bfloat16_t(float f) : bits(FloatToBf16Bits(f)) {}
  explicit operator float() const { return BitsToFloat(static_cast<uint32_t>(bits) << 16); }
};

enum class CacheLine { SINGLE_CACHE_LINE, ENTIRE_DATA_CACHE };
enum class DcciDst { CACHELINE_ALL, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };

enum class RoundMode { CAST_NONE, CAST_RINT, CAST_ROUND, CAST_FLOOR, CAST_CEIL, CAST_TRUNC, CAST_ODD };

// Buffer positions: the unified buffer of a vector core, and the Cube unit's L1 / L0 buffers.
enum class TPosition { GM, VECIN, VECOUT, VECCALC, A1, B1, A2, B2, CO1, CO2 };
using QuePosition = TPosition;

enum pipe_t { PIPE_S, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_FIX, PIPE_ALL };
enum class HardEvent { MTE2_V, V_MTE3, MTE3_V, V_S, S_V, MTE2_S, S_MTE3, MTE3_S };

// The simulator executes every instruction in program order, so barriers and flags have nothing to
// wait for; they are accepted so the kernels compile unchanged.
template <pipe_t pipe> inline void PipeBarrier() {}

// Every core of the launch (the AIVs alone with isAIVOnly) waits here until all of them arrive (the runner
// checks they all do).
template <bool isAIVOnly = true>
inline void SyncAll() {
  if (isAIVOnly) RequireCore(CoreType::kAiv, "SyncAll<true> (the vector cores' barrier)");
  RequireHardSync(Sim().declared_type, "SyncAll");
  if (Sim().sync_all) Sim().sync_all(isAIVOnly);
}
template <HardEvent e> inline void SetFlag(int32_t) {}
template <HardEvent e> inline void WaitFlag(int32_t) {}

}  // namespace AscendC

#endif  // MS_ATB_ASCENDC_SIM_CORE_H_
