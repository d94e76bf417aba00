"""The CPU implementation of the Ascend C API subset (ops/ascendc/cpu_sim) stops kernels that break the
rules real hardware depends on, with a message naming the rule. The kernel variants are written here,
compiled against it, and run through its launcher, as the product kernels are."""
import ctypes
import re

import numpy as np
import pytest

from ascendc_gm_rule import gm_addr_uses
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

// The Cube: c [M, N] float = a [M, K] x bt [N, K]^T (half), through L1, L0A / L0B and L0C; each variant
// but the first breaks one rule.
enum CubeVariant { kCubeCorrect, kBadShape, kL0Overflow, kWrongPosition };
constexpr uint32_t M = 32, K = 48, N = 16;

template <int V>
void CubeKernel(GM_ADDR a, GM_ADDR bt, GM_ADDR c) {
  TPipe pipe;
  TQue<QuePosition::A1, 1> a1;
  TQue<QuePosition::B1, 1> b1;
  TQue<QuePosition::A2, 1> a2;
  TQue<QuePosition::B2, 1> b2;
  TQue<QuePosition::CO1, 1> c1;
  pipe.InitBuffer(a1, 1, M * K * 2);
  pipe.InitBuffer(b1, 1, N * K * 2);
  pipe.InitBuffer(a2, 1, V == kL0Overflow ? 64 * 1024 + 32 : M * K * 2);  // past L0A's 64 KiB
  pipe.InitBuffer(b2, 1, N * K * 2);
  pipe.InitBuffer(c1, 1, M * N * 4);
  GlobalTensor<half> ga, gb;
  GlobalTensor<float> gc;
  ga.SetGlobalBuffer((__gm__ half *)a, M * K);   // [M, K]
  gb.SetGlobalBuffer((__gm__ half *)bt, N * K);  // [N, K]
  gc.SetGlobalBuffer((__gm__ float *)c, M * N);  // [M, N]
  LocalTensor<half> la = a1.AllocTensor<half>(), lb = b1.AllocTensor<half>();
  DataCopy(la, ga, Nd2NzParams(1, M, K, 0, K, M, 1, 0));
  DataCopy(lb, gb, Nd2NzParams(1, N, K, 0, K, N, 1, 0));
  LocalTensor<half> za = a2.AllocTensor<half>(), zb = b2.AllocTensor<half>();
  for (uint32_t mb = 0; mb < M / 16; ++mb)
    LoadData(za[mb * (K / 16) * 256], la, LoadData2DParams(mb, K / 16, M / 16, 0, 0, false, 0));
  LoadData(zb, lb, LoadData2DParams(0, (K / 16) * (N / 16), 1, 0, 0, false, 0));
  LocalTensor<float> zc = c1.AllocTensor<float>();
  Mmad(zc, V == kWrongPosition ? la : za, zb, MmadParams(V == kBadShape ? 24 : M, N, K, false, 0, false, false, false));
  Fixpipe<float, float, CFG_ROW_MAJOR>(gc, zc, FixpipeParamsV220(N, M, M, N, false));
  a1.FreeTensor(la); b1.FreeTensor(lb); a2.FreeTensor(za); b2.FreeTensor(zb); c1.FreeTensor(zc);
}

extern "C" int RunCube(int variant, void *a, void *bt, void *c) {
  std::vector<GmTensor> gm{{a, M * K * 2}, {bt, N * K * 2}, {c, M * N * 4}};
  auto launch = [&] {
    auto *x = static_cast<uint8_t *>(a), *y = static_cast<uint8_t *>(bt), *z = static_cast<uint8_t *>(c);
    switch (variant) {
      case kCubeCorrect: CubeKernel<kCubeCorrect>(x, y, z); break;
      case kBadShape: CubeKernel<kBadShape>(x, y, z); break;
      case kL0Overflow: CubeKernel<kL0Overflow>(x, y, z); break;
      case kWrongPosition: CubeKernel<kWrongPosition>(x, y, z); break;
    }
  };
  return RunCores("cube", 1, 0, CoreCapacity(), gm, launch, LaunchForm::kAicOnly);  // the Cube core alone
}

// Four cores: each writes its index to slot[core], then after SyncAll reads its neighbour's slot into
// seen[core]; with skip, core 3 ends before the SyncAll.
extern "C" int RunSync(int skip, void *slots, void *seen) {
  std::vector<GmTensor> gm{{slots, 4 * 4}, {seen, 4 * 4}};
  auto launch = [&] {
    GlobalTensor<int32_t> s, r;
    s.SetGlobalBuffer((__gm__ int32_t *)slots, 4);
    r.SetGlobalBuffer((__gm__ int32_t *)seen, 4);
    const int64_t core = GetBlockIdx();
    s.SetValue(core, static_cast<int32_t>(core) + 1);
    if (skip && core == 3) return;
    SyncAll();
    r.SetValue(core, s.GetValue((core + 1) % 4));
  };
  return RunCores("sync", 4, 0, CoreCapacity(), gm, launch);
}
"""
VARIANTS = ["correct", "misaligned copy", "short copy", "overflow", "use after free", "no free", "dequeue empty",
            "global outside"]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ascendc_rules")
    (tmp / "variants.cc").write_text(KERNELS)
    target = tmp / "variants_ascendc.so"
    build.compile_library(target, ("-I", str(ascendc_build.SIM_DIR), "-O0", "-include", "kernel_operator.h"),
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
    assert error.startswith("variant: Ascend C rule") and re.search(message, error), error


CUBE_VARIANTS = ["correct", "bad shape", "L0 overflow", "wrong position"]


def run_cube(lib, variant):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((32, 48)).astype(np.float16)
    bt = rng.standard_normal((16, 48)).astype(np.float16)
    c = np.full((32, 16), np.nan, np.float32)
    ptr = lambda x: x.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    status = lib.RunCube(CUBE_VARIANTS.index(variant), ptr(a), ptr(bt), ptr(c))
    return status, lib.MsAtbAscendcLastError().decode(), a, bt, c


def test_the_cube_multiplies_through_l1_l0_and_fixpipe(kernels):
    """Nd2Nz into L1, LoadData into L0A (zZ) and L0B (nZ), Mmad into L0C, Fixpipe back to row-major:
    a x bt^T in float32 from the float16 values."""
    status, _, a, bt, c = run_cube(kernels, "correct")
    assert status == 0
    np.testing.assert_allclose(c, a.astype(np.float64) @ bt.astype(np.float64).T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant, message", [
    ("bad shape", r'rule "cube shape" broken: Mmad m = 24: not a whole number of 16-element fractals'),
    ("L0 overflow", r'rule "capacity" broken: InitBuffers of one core ask for 65568 bytes of L0A, which holds 65536'),
    ("wrong position", r'rule "cube operand position" broken: Mmad: the left matrix is not in L0A'),
])
def test_a_broken_cube_rule_stops_the_kernel_with_its_name(kernels, variant, message):
    status, error, *_ = run_cube(kernels, variant)
    assert status == 1 and re.search(message, error), error


def test_sync_all_orders_every_cores_work_and_is_reached_by_all(kernels):
    slots, seen = np.zeros(4, np.int32), np.zeros(4, np.int32)
    ptr = lambda x: x.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    assert kernels.RunSync(0, ptr(slots), ptr(seen)) == 0
    assert seen.tolist() == [2, 3, 4, 1]   # core 3 reads core 0's slot: written before the SyncAll
    assert kernels.RunSync(1, ptr(slots), ptr(seen)) == 1
    assert re.search(r'rule "cross-core sync" broken: 1 of 4 cores ended without reaching the SyncAll',
                     kernels.MsAtbAscendcLastError().decode())


# ---- the source check: global memory only through GlobalTensor (tests/ascendc_gm_rule.py) --------------

_PLANTED = r"""
#include "kernel_operator.h"
using namespace AscendC;

__aicore__ inline float Peek(uint8_t *p) { return p[0]; }
__aicore__ inline void Two(GM_ADDR a, int n) {}

class Op {
 public:
  __aicore__ inline void Init(GM_ADDR x, GM_ADDR scale, GM_ADDR out) {
    x_.SetGlobalBuffer((__gm__ half *)x, 16);   // [16]
    out_.SetGlobalBuffer(( __gm__ half * ) out, 16);
    BODY
  }
  GlobalTensor<half> x_, out_;
  GlobalTensor<float> scale_;
  float s_;
};

extern "C" __global__ __aicore__ void k(GM_ADDR x, GM_ADDR scale, GM_ADDR out, GM_ADDR workspace, GM_ADDR tiling) {
  GET_TILING_DATA_WITH_STRUCT(Tiling, td, tiling);
  GM_ADDR user = AscendC::GetUserWorkspace(workspace);
  Op op;
  op.Init(x, scale, user);
  Two(scale, 1);
}
"""


def _planted(body: str) -> tuple[int, list]:
    return gm_addr_uses({"k.cpp": _PLANTED.replace("BODY", body)})


def test_the_kernels_reach_global_memory_only_through_global_tensors():
    sources = {p.name: p.read_text() for p in sorted(ascendc_build.KERNEL_DIR.iterdir()) if p.suffix in (".cpp", ".h")}
    checked, violations = gm_addr_uses(sources)
    assert violations == [] and checked >= 40          # every GM_ADDR argument of both kernels, each of its uses
    assert _planted("scale_.SetGlobalBuffer((__gm__ float *)scale, 1);") == (9, [])


@pytest.mark.parametrize("body", [
    "s_ = *reinterpret_cast<float *>(scale);",            # the raw read the CPU implementation cannot see
    "s_ = *(__gm__ float *)scale;",
    "s_ = ((__gm__ float *)scale)[0];",
    "s_ = scale[0];",
    "auto p = scale + 4;",
    "s_ = Peek(scale);",                                  # a function that does not take a GM_ADDR
    "Two(1, scale);",                                     # ... not in that place
    "GM_ADDR q = scale;",
    "if (scale) s_ = 1;",
    "scale_.SetGlobalBuffer((__gm__ float *)scale + 4, 1);",
    "scale_.SetGlobalBuffer((float *)scale, 1);",
])
def test_the_source_check_catches_a_raw_global_memory_access(body):
    checked, violations = _planted(body)
    line = _PLANTED.replace("BODY", body).splitlines().index("    " + body) + 1
    assert violations and all(v.startswith(f"k.cpp:{line}: ") for v in violations)
    assert f"k.cpp:{line}: GM_ADDR 'scale' used other than as SetGlobalBuffer's pointer or an argument taking a " \
           "GM_ADDR" in violations


@pytest.mark.parametrize("body, what", [
    ("__gm__ float *p = nullptr;", "__gm__ outside a cast given to SetGlobalBuffer"),
    ("s_ = scale_.GetPhyAddr()[0];", "GetPhyAddr gives a raw global pointer"),
])
def test_raw_global_pointers_are_refused_whatever_their_source(body, what):
    line = _PLANTED.replace("BODY", body).splitlines().index("    " + body) + 1
    assert _planted(body)[1] == [f"k.cpp:{line}: {what}"]
