// Software prefetches the compiler keeps. GCC takes __builtin_prefetch for a statement without effects and drops
// it from any loop it vectorises, and a loop of nothing but prefetches (a block's rows, a stretch of a panel) is
// one it vectorises: with the builtin, PagedAttention's decode pass has no prefetch instruction left and runs at
// about half its speed over a cache in DRAM (M's shape at 512 tokens, 2 threads, Zen 4: 142-147 us a layer against
// 69-70; AArch64 the same: no prfm left in it). On x86 and AArch64 an asm statement asks for the line instead,
// which no vectoriser touches; elsewhere the builtin. test_prefetch_kept.py checks the built code for them.
#ifndef MS_ATB_OPS_PREFETCH_H_
#define MS_ATB_OPS_PREFETCH_H_

#include <cstdint>

namespace ms_atb {

// The cache line holding address `at` into L1 (PrefetchL1) or L2 (PrefetchL2). `at` may lie past the end of an
// array (a prefetch never faults), so it is taken as an integer.
inline void PrefetchL1(uintptr_t at) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*reinterpret_cast<const char *>(at)));
#elif defined(__aarch64__)
  asm volatile("prfm pldl1keep, [%0]" : : "r"(at));
#else
  __builtin_prefetch(reinterpret_cast<const void *>(at), 0, 3);
#endif
}

inline void PrefetchL2(uintptr_t at) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht1 %0" : : "m"(*reinterpret_cast<const char *>(at)));
#elif defined(__aarch64__)
  asm volatile("prfm pldl2keep, [%0]" : : "r"(at));
#else
  __builtin_prefetch(reinterpret_cast<const void *>(at), 0, 2);
#endif
}

}  // namespace ms_atb

#endif  // MS_ATB_OPS_PREFETCH_H_
