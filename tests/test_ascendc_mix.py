"""Mixed (Cube + vector) AscendC kernels on the CPU: a launch of KERNEL_TYPE_MIX_AIC_1_2 runs each group's AIC and
two AIVs as separate programs that meet only at CrossCoreSetFlag / CrossCoreWaitFlag. The kernel variants of the
rules are written here and compiled against ops/ascendc/cpu_sim; the product's prefill launch is checked against
the numpy reference through the same runner."""
import ctypes
import re
import subprocess
import sys

import numpy as np
import pytest

from ms_atb.ops import ascendc_build, build
from ascendc_helpers import call, values
from ops_reference import dequantize_ref, paged_attention_ref
from test_ascendc_kernels import CONFIGS, TOLERANCE, check, int8_batch, tiling_of

KERNELS = r"""
#include "sim_runner.h"
using namespace AscendC;

namespace {
// Per group g: each AIV writes its value (10 x its block index + 1) to its slot of ws_v and sets flag 5; the
// AIC waits for flag 5 (both AIVs), writes the sum of the two to ws_c[g] and sets flag 3; each AIV waits for
// flag 3, reads ws_c[g] into its unified buffer, adds its index in the group + 1 and writes out[its block index].
// ids[program] = (1 on the AIC, GetBlockIdx, GetSubBlockIdx, GetBlockNum). Each variant but the first breaks one rule.
enum Variant { kCorrect, kForgetSet, kOneAivSets, kNeverWaited, kAivMmad, kAicVector, kUndeclared, kBadFlagId,
               kAivOnlySync };

template <int V>
void Kernel(GM_ADDR ws_v, GM_ADDR ws_c, GM_ADDR out, GM_ADDR ids) {
  if (V == kAivOnlySync) KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  else if (V != kUndeclared) KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
  const int64_t groups = GetBlockNum();
  GlobalTensor<float> v, c, o;
  GlobalTensor<int32_t> id;
  v.SetGlobalBuffer((__gm__ float *)ws_v, groups * 2 * 8);  // [groups * 2, 8]
  c.SetGlobalBuffer((__gm__ float *)ws_c, groups * 8);      // [groups, 8]
  o.SetGlobalBuffer((__gm__ float *)out, groups * 2 * 8);   // [groups * 2, 8]
  id.SetGlobalBuffer((__gm__ int32_t *)ids, groups * 3 * 4);  // [groups * 3, 4]
  if (V == kAivOnlySync) {
    SyncAll();
    return;
  }
  if ASCEND_IS_AIC {
    const int64_t g = GetBlockIdx();
    const int32_t mine[4] = {1, int32_t(g), int32_t(GetSubBlockIdx()), int32_t(groups)};
    for (int i = 0; i < 4; ++i) id.SetValue(g * 12 + i, mine[i]);
    if (V == kAicVector) {
      LocalTensor<float> none;
      Duplicate(none, 0.0f, 8);
    }
    CrossCoreWaitFlag<2, PIPE_S>(5);
    const float sum = v.GetValue(g * 16) + v.GetValue(g * 16 + 8);
    for (int i = 0; i < 8; ++i) c.SetValue(g * 8 + i, sum);
    if (V != kForgetSet) CrossCoreSetFlag<2, PIPE_FIX>(V == kBadFlagId ? 11 : 3);
    if (V == kNeverWaited) CrossCoreSetFlag<2, PIPE_FIX>(6);
    return;
  }
  const int64_t aiv = GetBlockIdx(), g = aiv / 2, sub = GetSubBlockIdx();
  const int32_t mine[4] = {0, int32_t(aiv), int32_t(sub), int32_t(groups)};
  for (int i = 0; i < 4; ++i) id.SetValue((g * 3 + 1 + sub) * 4 + i, mine[i]);
  if (V == kAivMmad) {
    LocalTensor<float> l0c;
    LocalTensor<half> l0a, l0b;
    Mmad(l0c, l0a, l0b, MmadParams(16, 16, 16, false, 0, false, false, false));
  }
  TPipe pipe;
  TBuf<TPosition::VECCALC> buf;
  pipe.InitBuffer(buf, 32);
  for (int i = 0; i < 8; ++i) v.SetValue(aiv * 8 + i, float(10 * aiv + 1));
  if (V != kOneAivSets || sub == 0) CrossCoreSetFlag<2, PIPE_MTE3>(5);
  CrossCoreWaitFlag<2, PIPE_MTE2>(3);
  LocalTensor<float> t = buf.Get<float>();  // [8]
  DataCopy(t, c[g * 8], 8);
  Adds(t, t, float(sub + 1), 8);
  DataCopy(o[aiv * 8], t, 8);
}
}  // namespace

extern "C" int Run(int variant, int groups, void *ws_v, void *ws_c, void *out, void *ids) {
  std::vector<GmTensor> gm{{ws_v, uint64_t(groups) * 64}, {ws_c, uint64_t(groups) * 32}, {out, uint64_t(groups) * 64},
                           {ids, uint64_t(groups) * 48}};
  auto launch = [&] {
    auto *a = static_cast<uint8_t *>(ws_v), *b = static_cast<uint8_t *>(ws_c);
    auto *x = static_cast<uint8_t *>(out), *y = static_cast<uint8_t *>(ids);
    switch (variant) {
      case kCorrect: Kernel<kCorrect>(a, b, x, y); break;
      case kForgetSet: Kernel<kForgetSet>(a, b, x, y); break;
      case kOneAivSets: Kernel<kOneAivSets>(a, b, x, y); break;
      case kNeverWaited: Kernel<kNeverWaited>(a, b, x, y); break;
      case kAivMmad: Kernel<kAivMmad>(a, b, x, y); break;
      case kAicVector: Kernel<kAicVector>(a, b, x, y); break;
      case kUndeclared: Kernel<kUndeclared>(a, b, x, y); break;
      case kBadFlagId: Kernel<kBadFlagId>(a, b, x, y); break;
      case kAivOnlySync: Kernel<kAivOnlySync>(a, b, x, y); break;
    }
  };
  return RunCores("mix", groups, 0, CoreCapacity(), gm, launch,
                  variant == kAivOnlySync ? LaunchForm::kAivOnly : LaunchForm::kMix12);
}
"""
VARIANTS = ["correct", "forget set", "one aiv sets", "never waited", "aiv mmad", "aic vector", "undeclared",
            "bad flag id", "aiv-only sync"]
GROUPS = 3


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ascendc_mix")
    (tmp / "mix.cc").write_text(KERNELS)
    target = tmp / "mix_ascendc.so"
    build.compile_library(target, ("-I", str(ascendc_build.SIM_DIR), "-O0", "-include", "kernel_operator.h"),
                          (str(tmp / "mix.cc"), str(ascendc_build.SIM_DIR / "sim_runner.cc")))
    return str(target)


@pytest.fixture(scope="module")
def kernels(library):
    lib = ctypes.CDLL(library)
    lib.MsAtbAscendcLastError.restype = ctypes.c_char_p
    return lib


def run(lib, variant, groups=GROUPS):
    arrays = [np.full((groups * 2, 8), np.nan, np.float32), np.full((groups, 8), np.nan, np.float32),
              np.full((groups * 2, 8), np.nan, np.float32), np.full((groups * 3, 4), -1, np.int32)]
    status = lib.Run(VARIANTS.index(variant), groups, *[a.ctypes.data_as(ctypes.c_void_p) for a in arrays])
    return status, lib.MsAtbAscendcLastError().decode(), arrays


def test_a_mixed_launch_runs_one_aic_and_two_aivs_per_group_in_flag_order(kernels):
    status, error, (_, ws_c, out, ids) = run(kernels, "correct")
    assert status == 0, error
    for g in range(GROUPS):
        # the AIC waited for both AIVs' values before summing them; each AIV waited for the sum
        assert ws_c[g].tolist() == [float(20 * g + 1 + 20 * g + 11)] * 8
        for sub in range(2):
            assert out[2 * g + sub].tolist() == [ws_c[g][0] + sub + 1] * 8
        # ASCEND_IS_AIC / AIV, GetBlockIdx, GetSubBlockIdx and GetBlockNum per program
        assert ids[3 * g].tolist() == [1, g, 0, GROUPS]
        assert ids[3 * g + 1].tolist() == [0, 2 * g, 0, GROUPS] and ids[3 * g + 2].tolist() == [0, 2 * g + 1, 1, GROUPS]


@pytest.mark.parametrize("variant, message", [
    ("forget set", r'rule "cross-core flag" broken: deadlock: the AIV 0 of core 0 waits at CrossCoreWaitFlag\(3\) '
                   r'and no program can set flag 3 any more'),
    ("one aiv sets", r'rule "cross-core flag" broken: deadlock: the AIC of core 0 waits at CrossCoreWaitFlag\(5\)'),
    ("never waited", r'rule "cross-core flag" broken: flag 6 was set for the AIV 0 of core 0 and never waited'),
    ("aiv mmad", r'rule "core type" broken: Mmad \(the Cube\'s matrix multiply\) runs on the AIC, called on an AIV'),
    ("aic vector", r'rule "core type" broken: the vector instruction Duplicate runs on the AIV, called on an AIC'),
    ("undeclared", r'rule "core type" broken: tiling key 0 launched as 1 AIC : 2 AIV groups, but the kernel does '
                   r'not declare KERNEL_TYPE_MIX_AIC_1_2'),
    ("bad flag id", r'rule "cross-core flag" broken: CrossCoreSetFlag flag id 11: the Atlas A2 has ids 0..10'),
    ("aiv-only sync", r'rule "core type" broken: SyncAll needs a kernel type with hardware sync'),
])
def test_a_broken_mixed_rule_stops_the_kernel_with_its_name(kernels, variant, message):
    status, error, _ = run(kernels, variant)
    assert status == 1 and error.startswith("mix: Ascend C rule") and re.search(message, error), error


def test_a_missing_set_flag_is_reported_not_hung(library):
    """On the hardware a wait for a flag nobody sets hangs the core; here the launch returns with the error at
    once (well inside the timeout), from a fresh process."""
    script = ("import ctypes, numpy as np\n"
              f"lib = ctypes.CDLL({library!r})\n"
              "lib.MsAtbAscendcLastError.restype = ctypes.c_char_p\n"
              "a = [np.zeros(n, np.float32) for n in (16, 8, 16, 12)]\n"
              "status = lib.Run(1, 1, *[x.ctypes.data_as(ctypes.c_void_p) for x in a])\n"
              "print(status, lib.MsAtbAscendcLastError().decode())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("1 mix: Ascend C rule \"cross-core flag\" broken: deadlock"), done.stdout + done.stderr
    assert "CrossCoreWaitFlag(3)" in done.stdout


@pytest.mark.parametrize("name, seqs, dtype, splits", [
    ("gqa3", [(100, 37), (1, 1), (33, 2)], "float16", False),  # decode items: the second AIV has no rows
    ("mha", [(300, 3)], "bfloat16", True),                     # context parts merged by the AIVs after SyncAll
])
def test_the_mixed_prefill_launch_matches_the_reference(name, seqs, dtype, splits):
    plan = tiling_of(name, seqs)
    assert plan["cube"] == 1 and plan["block_dim"] <= plan["cube_cores"] and (plan["kv_splits"] > 1) == splits
    # the workspace: each group's exchange area, then a partial per (item, part, AIV)
    partials = plan["base_items"] * plan["kv_splits"] * 2 * plan["partial_bytes"]
    assert plan["workspace_bytes"] == plan["block_dim"] * plan["ws_core_bytes"] + partials
    check(name, seqs, "scattered", dtype, seed=5)


@pytest.mark.parametrize("name, seqs, dtype", [
    ("gqa4", [(1100, 8)], "bfloat16"),   # one chunk, its context split over the groups
    pytest.param("gqa8_bs128", [(2048, 1), (1100, 8), (129, 129), (5, 5)], "float16",   # long spans: P's
                 marks=pytest.mark.slow),                                                # small values
])
def test_int8_caches_reach_the_cube_widened_by_the_aivs(name, seqs, dtype):
    """Prefill chunks over int8 caches: the AIVs widen their half of each span's rows to 16 bits (exact) for the
    Cube and apply the K scales to the scores and the V scales (relative to the span's largest) to P. The Cube
    path rounds P to 16 bits and the output once, so against the float64 reference over the dequantised values
    |error| <= u (|out| + sum_n p_n |v_n|), u the 16-bit type's half-ulp (2^-11 float16, 2^-8 bfloat16): the
    reference's sum of p_n |v_n| is its attention over |V|."""
    plan = tiling_of(name, seqs, "int8")
    assert plan["cube"] == 1 and (plan["kv_splits"] > 1) == (len(seqs) == 1)
    d = CONFIGS[name][2]
    kc, vc, ks, vs, query, tables, lens, qsl = int8_batch(name, seqs, dtype, 7)
    out = np.full(query.shape, 0x7FC0, np.uint16).view(query.dtype)
    status = call("MsAtbPagedAttentionQuant",
                  [query, kc, vc, tables, lens, qsl, np.array([d ** -0.5], np.float32), ks, vs, out],
                  [dtype, "int8", "int8"] + ["int32"] * 3 + ["float32"] * 3 + [dtype])
    assert status == 0
    ref = paged_attention_ref(values(query, dtype), dequantize_ref(kc, ks), dequantize_ref(vc, vs), tables, lens, qsl,
                              d ** -0.5)
    absv = paged_attention_ref(values(query, dtype), dequantize_ref(kc, ks), np.abs(dequantize_ref(vc, vs)), tables,
                               lens, qsl, d ** -0.5)
    got = values(out, dtype).astype(np.float64)
    assert np.all(np.abs(got - ref) <= TOLERANCE[dtype] / 2 * (np.abs(ref) + absv) + 1e-6)
