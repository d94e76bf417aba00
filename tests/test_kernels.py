"""The CPU kernels of ops/matmul.cc and ops/elementwise.cc against float64 numpy inside graph-mode Cells,
the composite (MindSpore ops) paths in float16, the packed linears, thread-count independence and the
kernel profile."""
import os
import re
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from ms_atb.models.llama import LlamaConfig, rope_tables
from ms_atb.models.parallel import ColumnParallelLinear, RowParallelLinear
from ms_atb.ops import PackedMatMul, RmsNorm, RotaryEmbedding, SwiGlu, build, pack_weight, packed_shape, unpack_weight
from graph_helpers import Apply, close, run
from ops_reference import rms_norm_ref, rope_ref, swiglu_ref

ms.set_context(mode=ms.GRAPH_MODE)


def matmul(x, w):
    """x [M, K] @ w [K, N] through PackedMatMul in a graph -> [M, N]."""
    return run(Apply(PackedMatMul(w.shape[1])), x, pack_weight(w))


def random_mm(rng, m, k, n):
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


# (M, K, N): M in {1, 5, 6, 7, 11, 12, 13, 33, 130, 200}, K in {0, 1, 16, 70, 576}, N in {1, 15, 16, 17, 48, 100};
# M 5/7/33/130 leave partial 6-row tiles (AVX2), 11/13/33/130 partial 12-row tiles (AVX-512), 130 spans
# three 48-row blocks and 200 three 96-row blocks; N 1/15/17/100 a partial panel.
MM_SHAPES = [(1, 1, 1), (1, 576, 100), (5, 16, 15), (5, 576, 1), (6, 16, 16), (6, 1, 48), (7, 70, 17),
             (7, 0, 17), (33, 576, 48), (33, 16, 16), (130, 70, 100), (130, 576, 17), (130, 1, 15),
             (11, 576, 33), (13, 70, 16), (12, 16, 48), (200, 576, 100)]


@pytest.mark.parametrize("m,k,n", MM_SHAPES)
def test_packed_matmul_matches_numpy(m, k, n):
    rng = np.random.default_rng([m, k, n])
    x, w = random_mm(rng, m, k, n)
    out = matmul(x, w)
    assert out.shape == (m, n) and out.dtype == np.float32
    np.testing.assert_allclose(out, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5 * max(k, 1))


@pytest.mark.parametrize("rows", [0, 1, 5, 13, 33, 40])
def test_packed_matmul_rows_skips_padding(rows):
    """With rows, only x's first `rows` rows are multiplied (clamped to M); the rest of y is zero, whatever x holds."""
    rng = np.random.default_rng(rows)
    x, w = random_mm(rng, 33, 70, 17)
    x[rows:] = np.nan  # padding rows must not be read
    out = run(Apply(PackedMatMul(17)), x, pack_weight(w), np.array([rows], np.int32))
    valid = min(rows, 33)
    np.testing.assert_allclose(out[:valid], x[:valid].astype(np.float64) @ w, rtol=1e-5, atol=1e-5 * 70)
    assert not out[valid:].any()


def test_packed_matmul_dynamic_shapes():
    cell = Apply(PackedMatMul(17))
    cell.set_inputs(Tensor(shape=[None, None], dtype=ms.float32), Tensor(shape=[None, None, None], dtype=ms.float32))
    rng = np.random.default_rng(7)
    for m, k in [(1, 70), (7, 70), (130, 16)]:
        x, w = random_mm(rng, m, k, 17)
        out = run(cell, x, pack_weight(w))
        assert out.shape == (m, 17)
        np.testing.assert_allclose(out, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5 * k)


def test_packed_matmul_rejects_empty_output():
    with pytest.raises(ValueError, match="out_features"):
        PackedMatMul(0)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 33, 100])
def test_pack_unpack_round_trip_and_zero_padding(n):
    rng = np.random.default_rng(n)
    w = rng.standard_normal((70, n))  # float64: pack_weight casts
    packed = pack_weight(w)
    assert packed.dtype == np.float32 and packed.shape == packed_shape(70, n) == (-(-n // 16), 70, 16)
    for col in (0, n // 2, n - 1):  # column c lives in panel c // 16, lane c % 16
        assert np.array_equal(packed[col // 16, :, col % 16], w[:, col].astype(np.float32))
    assert not packed[-1, :, n - 16 * (packed.shape[0] - 1):].any()
    assert np.array_equal(unpack_weight(packed, n), w.astype(np.float32))


def test_packed_shape():
    assert packed_shape(576, 1536) == (96, 576, 16)
    assert packed_shape(1, 1) == (1, 1, 16)
    assert packed_shape(64, 17) == (2, 64, 16)


# Thread independence and the profile run in subprocesses (the thread pool and the profile flag are read
# once per process); both are started together to share the cost of importing MindSpore.
THREAD_CASES = [(130, 576, 100), (7, 70, 17), (33, 16, 48)]
SUBPROCESS_CODE = """
import sys
import numpy as np
import mindspore as ms
from mindspore import Tensor
from ms_atb.ops import PackedMatMul
ms.set_context(mode=ms.GRAPH_MODE)
data = np.load(sys.argv[1])
outs = {}
for i in range(int(data["count"])):
    w = data[f"w{i}"]
    outs[f"y{i}"] = PackedMatMul(int(data[f"n{i}"]))(Tensor(data[f"x{i}"]), Tensor(w)).asnumpy()
np.savez(sys.argv[2], **outs)
"""


@pytest.fixture(scope="module")
def subprocess_runs(tmp_path_factory):
    """{"one_thread" | "profiled": (outputs, stderr)} and the inputs, from two concurrent subprocesses."""
    tmp = tmp_path_factory.mktemp("kernels")
    rng = np.random.default_rng(11)
    inputs = {"count": len(THREAD_CASES)}
    for i, (m, k, n) in enumerate(THREAD_CASES):
        x, w = random_mm(rng, m, k, n)
        inputs.update({f"x{i}": x, f"w{i}": pack_weight(w), f"n{i}": n})
    np.savez(tmp / "in.npz", **inputs)
    base = {k: v for k, v in os.environ.items() if k != "MS_ATB_KERNEL_PROFILE"}
    # this process runs the pool's default size; the other process must differ from it
    other = "3" if os.environ.get("MS_ATB_NUM_THREADS") == "1" else "1"
    envs = {"one_thread": dict(base, MS_ATB_NUM_THREADS=other), "profiled": dict(base, MS_ATB_KERNEL_PROFILE="1")}
    procs = {name: subprocess.Popen([sys.executable, "-c", SUBPROCESS_CODE, str(tmp / "in.npz"),
                                     str(tmp / f"{name}.npz")], env=env, stderr=subprocess.PIPE, text=True)
             for name, env in envs.items()}
    runs = {}
    for name, proc in procs.items():
        stderr = proc.communicate(timeout=300)[1]
        assert proc.returncode == 0, stderr[-3000:]
        runs[name] = (dict(np.load(tmp / f"{name}.npz")), stderr)
    return runs, inputs


@pytest.mark.slow
def test_packed_matmul_independent_of_thread_count(subprocess_runs):
    runs, inputs = subprocess_runs
    one_thread, _ = runs["one_thread"]
    for i, (m, k, n) in enumerate(THREAD_CASES):
        here = run(Apply(PackedMatMul(n)), inputs[f"x{i}"], inputs[f"w{i}"])
        assert np.array_equal(here, one_thread[f"y{i}"]), (m, k, n)


@pytest.mark.slow
def test_kernel_profile_printed_only_when_enabled(subprocess_runs):
    runs, _ = subprocess_runs
    line = re.compile(r"ms_atb kernel profile: PackedMatMul\s+(\d+) calls")
    found = line.search(runs["profiled"][1])
    assert found and int(found.group(1)) >= len(THREAD_CASES)
    assert "ms_atb kernel profile" not in runs["one_thread"][1]


def test_kernel_library_exports_only_its_c_entry_points():
    """A library's C++ symbols (its thread pool, kernel profile, thread_local buffers, template functions) stay
    its own: the ISA variants the tests load beside it, or any other library in the process, can neither
    share them (STB_GNU_UNIQUE statics) nor bind to them."""
    symbols = subprocess.run(["readelf", "-W", "--dyn-syms", build.kernel_library()], capture_output=True,
                             text=True, check=True).stdout
    defined = [f.split() for f in symbols.splitlines() if re.match(r"\s*\d+:", f) and " UND " not in f]
    names = {row[7].split("@")[0] for row in defined if len(row) > 7}
    assert {"PagedAttention", "PagedAttentionInferShape", "QuantMatMulQ4_0", "DecoderLayer"} <= names
    assert sorted(n for n in names if not re.fullmatch(r"[A-Z]\w*", n)) == []
    assert not any(row[4] == "UNIQUE" for row in defined)


def test_linear_set_weight_rejects_wrong_shape():
    with pytest.raises(ValueError, match=re.escape("must be (8, 17), found (17, 8)")):
        ColumnParallelLinear(8, (9, 8)).set_weight(np.zeros((17, 8), np.float32))
    with pytest.raises(ValueError, match=re.escape("must be (16, 5), found (16,)")):
        RowParallelLinear(16, 5).set_weight(np.zeros(16, np.float32))


def test_column_parallel_linear_out_17_exactly_like_numpy():
    rng = np.random.default_rng(3)
    lin = ColumnParallelLinear(70, (9, 8))
    assert lin.packed and tuple(lin.weight.shape) == packed_shape(70, 17)
    # small integers: every product and partial sum is exact in float32, so any order gives x @ w exactly
    x = rng.integers(-4, 5, (7, 70)).astype(np.float32)
    w = rng.integers(-4, 5, (70, 17)).astype(np.float32)
    lin.set_weight(w)
    out = run(Apply(lin), x)
    assert out.shape == (7, 17) and np.array_equal(out, x @ w)


def test_linear_keeps_plain_layout_off_the_cpu_and_packs_half_precision_on_it():
    lin = ColumnParallelLinear(8, 17, dtype=ms.float16, device="npu")
    assert not lin.packed and tuple(lin.weight.shape) == (8, 17) and lin.weight.dtype == ms.float16
    half = ColumnParallelLinear(70, (9, 8), dtype=ms.float16)       # the CPU: float32 panels, casts around them
    assert half.packed and tuple(half.weight.shape) == packed_shape(70, 17) and half.weight.dtype == ms.float32
    rng = np.random.default_rng(3)
    x = rng.integers(-4, 5, (7, 70)).astype(np.float16)
    w = rng.integers(-4, 5, (70, 17)).astype(np.float32)
    half.set_weight(w)
    out = run(Apply(half), x)
    assert out.dtype == np.float16 and np.array_equal(out, (x.astype(np.float32) @ w).astype(np.float16))


@pytest.mark.parametrize("t,h", [(5, 64), (300, 576)])
def test_rms_norm_fused(t, h):
    rng = np.random.default_rng(h)
    x = rng.standard_normal((t, h)).astype(np.float32)
    x[1] = 0.0  # eps keeps it finite: zeros out
    x[2] *= 1e-4  # mean(x^2) ~ 1e-8, below eps: eps must be added
    x[3] *= 1e3
    weight = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
    norm = RmsNorm(1e-6)
    assert norm.fused
    out = run(Apply(norm), x, weight)
    assert out.dtype == np.float32 and not out[1].any()
    close(out, rms_norm_ref(x, weight, 1e-6), 1e-5)


def test_rms_norm_composite_float16():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 64)).astype(np.float16)
    weight = (1 + 0.1 * rng.standard_normal(64)).astype(np.float16)
    norm = RmsNorm(1e-6, ms.float16)
    assert not norm.fused
    out = run(Apply(norm), x, weight)
    assert out.dtype == np.float16
    close(out, rms_norm_ref(x, weight, 1e-6), 2e-3)


def rope_case(interleaved, t, dtype):
    """qkv [T, (4 + 2 + 2) * 16] with 6 rotated heads (q, k), the tables of rope_tables, the reference."""
    heads, kv_heads, d = 4, 2, 16
    config = LlamaConfig(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=d,
                         max_position_embeddings=512, rope_interleaved=interleaved)
    cos, sin, perm = rope_tables(config)  # [P, D], [P, D], [D]
    rng = np.random.default_rng([t, interleaved])
    positions = rng.integers(0, 512, t)
    qkv = rng.standard_normal((t, (heads + 2 * kv_heads) * d)).astype(dtype)
    rotated = (heads + kv_heads) * d
    ref = qkv.astype(np.float64)
    ref[:, :rotated] = rope_ref(qkv[:, :rotated].reshape(t, heads + kv_heads, d), positions, config.rope_theta,
                                interleaved).reshape(t, rotated)
    return heads + kv_heads, d, (qkv, cos[positions].astype(dtype), sin[positions].astype(dtype), perm), ref


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("t", [5, 300])
def test_rotary_embedding_fused(interleaved, t):
    rotated_heads, d, inputs, ref = rope_case(interleaved, t, np.float32)
    rope = RotaryEmbedding(rotated_heads, d)
    assert rope.fused
    out = run(Apply(rope), *inputs)
    close(out, ref, 1e-5)
    assert np.array_equal(out[:, rotated_heads * d:], inputs[0][:, rotated_heads * d:])  # v copied


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_embedding_composite_float16(interleaved):
    rotated_heads, d, inputs, ref = rope_case(interleaved, 5, np.float16)
    rope = RotaryEmbedding(rotated_heads, d, ms.float16)
    assert not rope.fused
    out = run(Apply(rope), *inputs)
    assert out.dtype == np.float16
    close(out, ref, 2e-3)
    assert np.array_equal(out[:, rotated_heads * d:], inputs[0][:, rotated_heads * d:])


EXTREME_GATES = [100.0, -100.0, 1e4, -1e4, 88.0, -88.0, 87.5, -87.5, 0.0, 1e-3, -1e-3, 20.0, -20.0]


def test_swiglu_fused_with_large_gates():
    rng = np.random.default_rng(5)
    t, i = 300, 128  # several row chunks: runs on the thread pool
    gate = np.linspace(-30, 30, t * i).reshape(t, i)
    gate[0, :len(EXTREME_GATES)] = EXTREME_GATES
    gate_up = np.concatenate([gate, rng.uniform(-2, 2, (t, i))], axis=1).astype(np.float32)
    swiglu = SwiGlu()
    assert swiglu.fused
    out = run(Apply(swiglu), gate_up)
    assert out.shape == (t, i) and np.isfinite(out).all()
    close(out, swiglu_ref(gate_up), 1e-5)


def test_swiglu_composite_float16_with_large_gates():
    rng = np.random.default_rng(6)
    gate = np.array([EXTREME_GATES, np.linspace(-8, 8, len(EXTREME_GATES))])
    gate_up = np.concatenate([gate, rng.uniform(-2, 2, gate.shape)], axis=1).astype(np.float16)
    swiglu = SwiGlu(ms.float16)
    assert not swiglu.fused
    out = run(Apply(swiglu), gate_up)
    assert out.dtype == np.float16 and np.isfinite(out).all()
    close(out, swiglu_ref(gate_up), 2e-3)


def test_swiglu_fused_huge_negative_gate_is_zero():
    gate_up = np.array([[-3e38, -1e35, -1e30, 1.0, 1.0, 1.0]], np.float32)
    out = run(Apply(SwiGlu()), gate_up)
    assert np.abs(out).max() < 1e-30
