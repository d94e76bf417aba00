"""The GEMM-shaped kernels on every instruction-set path this CPU can run, not only the one -march=native
picks: the kernel library is rebuilt without AVX-512 (the AVX2 6 x 16 tile) and without AVX2/FMA (the
portable tile), and PackedMatMul and PagedAttention (decode and GEMM-tiled prefill items) are called
through their C ABI with ctypes and checked against numpy."""
import ctypes

import numpy as np
import pytest

from ms_atb.ops import build
from ms_atb.ops.matmul import pack_weight
from ops_reference import paged_attention_ref

pytestmark = pytest.mark.slow      # each variant rebuilds the kernel library

VARIANTS = {"avx2": ("-mno-avx512f",), "portable": ("-mno-avx512f", "-mno-avx2", "-mno-fma")}


def _cpu_flags() -> set:
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def library(request, tmp_path_factory):
    flags = _cpu_flags()
    if request.param == "avx2" and not {"avx2", "fma"} <= flags:
        pytest.skip("the CPU has no AVX2/FMA")
    path = tmp_path_factory.mktemp(request.param) / "kernels.so"
    build.compile_library(path, VARIANTS[request.param], sources=("matmul.cc", "paged_attention.cc"))
    return ctypes.CDLL(str(path))


@pytest.mark.parametrize("m,k,n", [(1, 576, 100), (5, 70, 17), (7, 16, 48), (13, 576, 33), (33, 70, 100),
                                   (130, 64, 64)])
def test_packed_matmul_on_each_isa(library, m, k, n):
    rng = np.random.default_rng(m * 1000 + n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    packed = pack_weight(w)
    y = np.full((m, packed.shape[0] * 16), np.nan, np.float32)
    assert build.call_kernel(library.PackedMatMul, [x, packed, y]) == 0
    np.testing.assert_allclose(y[:, :n], x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bs,layout", [(16, "scattered"), (16, "contiguous"), (5, "contiguous")])
@pytest.mark.parametrize("queries", [[1, 1, 1], [40, 1, 17]])  # decode items; GEMM-tiled prefill tiles
def test_paged_attention_on_each_isa(library, queries, bs, layout):
    """Contiguous tables let the tiled path read a span of blocks in place; block size 5 makes spans
    of 45 tokens (9 blocks) that end mid-tile."""
    rng = np.random.default_rng(len(queries) + sum(queries) + bs)
    heads, kv_heads, dim = 9, 3, 64
    ctx = [70, 33, 50]
    per_seq = -(-max(ctx) // bs)
    nb = 3 * per_seq + 5
    kc = rng.standard_normal((nb, bs, kv_heads, dim)).astype(np.float32)
    vc = rng.standard_normal((nb, bs, kv_heads, dim)).astype(np.float32)
    ids = np.arange(nb) if layout == "contiguous" else rng.permutation(nb)
    tables = ids[:3 * per_seq].reshape(3, per_seq).astype(np.int32)
    qsl = np.concatenate([[0], np.cumsum(queries)]).astype(np.int32)
    q = rng.standard_normal((int(qsl[-1]), heads, dim)).astype(np.float32)
    lens, scale = np.array(ctx, np.int32), np.array([dim ** -0.5], np.float32)
    out = np.full(q.shape, np.nan, np.float32)
    assert build.call_kernel(library.PagedAttention, [q, kc, vc, tables, lens, qsl, scale, out]) == 0
    want = paged_attention_ref(q, kc, vc, tables, lens, qsl, float(scale[0]))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
