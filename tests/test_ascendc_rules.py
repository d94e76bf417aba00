"""The CPU implementation of the Ascend C API subset (ops/ascendc/cpu_sim) stops kernels that break the
rules real hardware depends on, with a message naming the rule. The kernel variants are written here,
compiled against it, and run through its launcher, as the product kernels are."""
import ctypes

import numpy as np
import pytest

from ms_atb.ops import ascendc_build, build

KERNELS = r"""
#include "sim_runner.h"
using namespace AscendC;

namespace {
// Copies 32 halves from in to out through one queue; each variant breaks one rule.
enum Variant { kCorrect, kMisalignedCopy, kShortCopy, kOverflow, kUseAfterFree, kNoFree, kDeQueEmpty, kGlobalOutside };

template <int V>
void Kernel(GM_ADDR in, GM_ADDR out) {
  TPipe pipe;
  TQue<QuePosition::VECIN, 1> que;
  TBuf<TPosition::VECCALC> scratch;
  pipe.InitBuffer(que, 1, 64);
  pipe.InitBuffer(scratch, V == kOverflow ? 192 * 1024 : 1024);  // with the queue: past 192 KiB
  GlobalTensor<half> src, dst;
  src.SetGlobalBuffer((__gm__ half *)in, 64);    // [64]
  dst.SetGlobalBuffer((__gm__ half *)out, 32);   // [32]
  if (V == kDeQueEmpty) {
    LocalTensor<half> none = que.DeQue<half>();
    return;
  }
  LocalTensor<half> t = que.AllocTensor<half>();  // [32]
  if (V == kMisalignedCopy) DataCopy(t, src[3], 32);             // 6 bytes past a 32-byte boundary
  else if (V == kShortCopy) DataCopy(t, src, 30);                // 60 bytes: not whole blocks
  else if (V == kGlobalOutside) DataCopy(t, src[48], 32);        // past the end of the 64-element input
  else DataCopy(t, src, 32);
  que.EnQue(t);
  t = que.DeQue<half>();
  if (V == kUseAfterFree) {
    que.FreeTensor(t);
    DataCopy(dst, t, 32);
    return;
  }
  DataCopy(dst, t, 32);
  if (V != kNoFree) que.FreeTensor(t);
}
}  // namespace

extern "C" int Run(int variant, void *in, void *out) {
  std::vector<GmTensor> gm{{in, 128}, {out, 64}};
  auto launch = [&] {
    uint8_t *i = static_cast<uint8_t *>(in);
    uint8_t *o = static_cast<uint8_t *>(out);
    switch (variant) {
      case kCorrect: Kernel<kCorrect>(i, o); break;
      case kMisalignedCopy: Kernel<kMisalignedCopy>(i, o); break;
      case kShortCopy: Kernel<kShortCopy>(i, o); break;
      case kOverflow: Kernel<kOverflow>(i, o); break;
      case kUseAfterFree: Kernel<kUseAfterFree>(i, o); break;
      case kNoFree: Kernel<kNoFree>(i, o); break;
      case kDeQueEmpty: Kernel<kDeQueEmpty>(i, o); break;
      case kGlobalOutside: Kernel<kGlobalOutside>(i, o); break;
    }
  };
  return RunCores("variant", 2, 0, CoreCapacity(), gm, launch);
}
"""
VARIANTS = ["correct", "misaligned copy", "short copy", "overflow", "use after free", "no free", "dequeue empty",
            "global outside"]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ascendc_rules")
    (tmp / "variants.cc").write_text(KERNELS)
    target = tmp / "variants_ascendc.so"
    build.compile_library(target, ("-I", str(ascendc_build.SIM_DIR), "-O0"),
                          (str(tmp / "variants.cc"), str(ascendc_build.SIM_DIR / "sim_runner.cc")))
    lib = ctypes.CDLL(str(target))
    lib.MsAtbAscendcLastError.restype = ctypes.c_char_p
    return lib


def run(lib, variant):
    data = np.arange(64, dtype=np.float16)
    out = np.zeros(32, np.float16)
    status = lib.Run(VARIANTS.index(variant), data.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p))
    return status, lib.MsAtbAscendcLastError().decode(), data, out


def test_a_kernel_that_keeps_the_rules_runs(kernels):
    status, _, data, out = run(kernels, "correct")
    assert status == 0 and np.array_equal(out, data[:32])


@pytest.mark.parametrize("variant, message", [
    ("misaligned copy", r'rule "copy alignment" broken: DataCopy at global offset 6 bytes, not 32-byte aligned'),
    ("short copy", r'rule "copy alignment" broken: DataCopy of 60 bytes, not a whole number of 32-byte blocks'),
    ("overflow", r'rule "capacity" broken: InitBuffers of one core ask for 196672 bytes of unified buffer, '
                 r'which holds 196608'),
    ("use after free", r'rule "use after FreeTensor" broken: a LocalTensor used after FreeTensor'),
    ("no free", r'rule "queue discipline" broken: an AllocTensor without FreeTensor \(core 0\)'),
    ("dequeue empty", r'rule "queue discipline" broken: DeQue of an empty queue'),
    ("global outside", r'rule "global memory access" broken: a copy of 32 elements from a global tensor of 16'),
])
def test_a_broken_rule_stops_the_kernel_with_its_name(kernels, variant, message):
    status, error, _, out = run(kernels, variant)
    assert status == 1
    assert error.startswith("variant: Ascend C rule") and __import__("re").search(message, error), error
