"""The GEMM-shaped kernels on every instruction-set path this CPU can run: the kernel library is rebuilt
without AVX-512 (the AVX2 6 x 16 tile) and without AVX2/FMA (the portable tile), the installed one on an
AVX-512 host, and PackedMatMul, QuantMatMul (each weight format, its register GEMV and its tile), QuantDot (int8 activations:
each weight format's integer dot products, 1 to 33 rows),
PagedAttention (decode and GEMM-tiled prefill items, over float32,
float16, bfloat16 and int8 caches, whose rows each path converts as it reads them) and ReshapeAndCache
(conversion and int8 quantisation) are called through their C ABI with ctypes and checked against numpy."""
import ctypes

import numpy as np
import pytest

from ms_atb.ops import build
from ms_atb.ops.matmul import pack_weight
from ops_reference import (QUANT_KERNELS, dequantize_ref, packed_and_reference, paged_attention_ref,
                           reshape_and_cache_int8_ref)
from quant_dot_reference import DOT_KERNELS, activation_bound, quant_dot_ref, weight_fields

pytestmark = pytest.mark.slow      # each variant rebuilds the kernel library

VARIANTS = {"avx2": ("-mno-avx512f",), "portable": ("-mno-avx512f", "-mno-avx2", "-mno-fma")}


def _cpu_flags() -> set:
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


_BUILT = {}     # variant -> library: a build takes a minute, and pytest may set the fixture up more than once


@pytest.fixture(scope="module", params=sorted(VARIANTS) + ["native"])
def library(request, tmp_path_factory):
    flags = _cpu_flags()
    if request.param == "avx2" and not {"avx2", "fma"} <= flags:
        pytest.skip("the CPU has no AVX2/FMA")
    if request.param == "native" and "avx512f" not in flags:
        pytest.skip("without AVX-512 the native build is the AVX2 variant")
    if request.param == "native":
        _BUILT.setdefault("native", ctypes.CDLL(build.kernel_library()))     # the AVX-512 paths, installed
    elif request.param not in _BUILT:
        if request.param == "avx2" and "avx512f" not in flags:
            # Without AVX-512 the native build is the AVX2 path, flag for flag: test the installed library.
            _BUILT["avx2"] = ctypes.CDLL(build.kernel_library())
        else:
            path = tmp_path_factory.mktemp(request.param) / "kernels.so"
            build.compile_library(path, VARIANTS[request.param], sources=(
                "matmul.cc", "paged_attention.cc", "quant_matmul.cc", "reshape_and_cache.cc"))
            _BUILT[request.param] = ctypes.CDLL(str(path))
    return _BUILT[request.param]


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


@pytest.mark.parametrize("fmt", sorted(QUANT_KERNELS))
@pytest.mark.parametrize("m,k,n", [(1, 576, 100), (2, 96, 40), (5, 64, 90), (13, 96, 40), (30, 64, 33)])
def test_quant_matmul_on_each_isa(library, fmt, m, k, n):
    """The quantized weights dequantised in registers (the GEMV of up to 8 rows: several panels in flight,
    then the odd ones; 5 rows: a group of 4, then 1) or into each path's float tile (AVX-512: panel pairs),
    against numpy and bit for bit against the same path's PackedMatMul over the dequantised weight."""
    packed, w = packed_and_reference(fmt, k, n, m + n)
    x = np.random.default_rng(k).standard_normal((m, k)).astype(np.float32)
    y = np.full((m, packed.shape[0] * 16), np.nan, np.float32)
    assert build.call_kernel(getattr(library, QUANT_KERNELS[fmt]), [x, packed, y]) == 0
    np.testing.assert_allclose(y[:, :n], x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    y_float = np.full_like(y, np.nan)
    assert build.call_kernel(library.PackedMatMul, [x, pack_weight(w), y_float]) == 0
    np.testing.assert_array_equal(y, y_float)


@pytest.mark.parametrize("fmt", sorted(DOT_KERNELS))
@pytest.mark.parametrize("m,k,n", [(1, 576, 100), (3, 96, 40), (8, 64, 90), (33, 64, 33), (12, 2112, 40),
                                   (66, 2112, 24)])
def test_quant_dot_on_each_isa(library, fmt, m, k, n):
    """int8 activations: each path's integer dot products (AVX2 maddubs + madd on 2 x 8 columns, portable
    loops) against the numpy model of the same integer arithmetic, within float32 rounding of its terms.
    12 and 66 rows of 66 blocks: AVX2's tiles with split nibbles (a chunk of 64 blocks, then 2), 66 rows in
    two row blocks (64 and 2)."""
    check_quant_dot(library, fmt, m, k, n)


def check_quant_dot(lib, fmt, m, k, n):
    packed, fields = weight_fields(fmt, k, n, m + k + n)
    x = np.random.default_rng(m * k).standard_normal((m, k)).astype(np.float32)
    x[0, 3] = -25.0                                     # an outlier: the other values of its block lose bits
    y = np.full((m, packed.shape[0] * 16), np.nan, np.float32)
    assert build.call_kernel(getattr(lib, DOT_KERNELS[fmt]), [x, packed, y]) == 0
    want, terms = quant_dot_ref(x, fmt, fields)
    assert np.all(np.abs(y[:, :n] - want) <= 1e-5 * terms + 1e-30)
    assert np.all(np.abs(y[:, :n] - x.astype(np.float64) @ fields[4]) <= activation_bound(x, fields[4]) * 1.0001
                  + 1e-5 * terms + 1e-30)


# Query heads a kv head: 3 (decode heads 2 + 1 at a time), 7 (4 + 2 + 1, and 48 columns: a P.V pass of 64 does not fit).
GROUPS = [(9, 3, 64), (14, 2, 48)]


@pytest.mark.parametrize("heads,kv_heads,dim", GROUPS)
@pytest.mark.parametrize("bs,layout", [(16, "scattered"), (16, "contiguous"), (5, "contiguous")])
@pytest.mark.parametrize("queries", [[1, 1, 1], [40, 1, 17]])  # decode items; GEMM-tiled prefill tiles
def test_paged_attention_on_each_isa(library, queries, bs, layout, heads, kv_heads, dim):
    """Contiguous tables let the tiled path read a span of blocks in place; block size 5 makes spans
    of 45 tokens (9 blocks) that end mid-tile."""
    rng = np.random.default_rng(len(queries) + sum(queries) + bs)
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


def call(fn, arrays, names):
    """build.call_kernel with the dtype names given (numpy has no bfloat16: its bits travel as uint16)."""
    n = len(arrays)
    params = (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays])
    ndims = (ctypes.c_int * n)(*[a.ndim for a in arrays])
    shapes = (ctypes.POINTER(ctypes.c_int64) * n)(*[(ctypes.c_int64 * max(a.ndim, 1))(*a.shape) for a in arrays])
    dtypes = (ctypes.c_char_p * n)(*[name.encode() for name in names])
    return fn(n, params, ndims, shapes, dtypes, None, None)


def to_bfloat16_bits(x):
    """float32 -> bfloat16 bits (uint16), round to nearest even, and the float32 values they hold."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("heads,kv_heads,dim", GROUPS)
@pytest.mark.parametrize("cache", ["float16", "bfloat16", "int8"])
@pytest.mark.parametrize("queries", [[1, 1, 1], [40, 1, 17]])
def test_paged_attention_over_narrow_caches_on_each_isa(library, queries, cache, heads, kv_heads, dim):
    """float32 queries over float16 / bfloat16 / int8 caches, written by ReshapeAndCache on the same path (the
    conversion, and int8's per-row quantisation, exactly as numpy does it); the attention against numpy over
    the values the caches hold. Scattered block tables, block size 16 (whole 16-value AVX-512 rows, D = 64 or 48)."""
    rng = np.random.default_rng(len(queries) + sum(queries))
    bs = 16
    ctx = [70, 33, 50]
    per_seq = -(-max(ctx) // bs)
    nb = 3 * per_seq + 5
    tables = rng.permutation(nb)[:3 * per_seq].reshape(3, per_seq).astype(np.int32)
    slots = np.array([tables[b, p // bs] * bs + p % bs for b in range(3) for p in range(ctx[b])], np.int32)
    key = (rng.standard_normal((len(slots), kv_heads, dim)) * rng.uniform(0.1, 5, (len(slots), kv_heads, 1))
           ).astype(np.float32)
    value = rng.standard_normal((len(slots), kv_heads, dim)).astype(np.float32)
    key[5, 1] = 0.0                                                  # an all-zero row: scale 0
    shape = (nb, bs, kv_heads, dim)
    done = np.zeros(1, np.int32)
    if cache == "int8":
        kc, vc = np.zeros(shape, np.int8), np.zeros(shape, np.int8)
        ks, vs = np.zeros(shape[:3], np.float32), np.zeros(shape[:3], np.float32)
        assert call(library.ReshapeAndCacheQuant, [key, value, kc, vc, slots, ks, vs, done],
                    ["float32", "float32", "int8", "int8", "int32", "float32", "float32", "int32"]) == 0
        want = reshape_and_cache_int8_ref(key, value, np.zeros(shape, np.int8), np.zeros(shape, np.int8),
                                          np.zeros(shape[:3], np.float32), np.zeros(shape[:3], np.float32), slots)
        for got, ref in zip((kc, vc, ks, vs), want):
            np.testing.assert_array_equal(got, ref)
        k_vals, v_vals = dequantize_ref(kc, ks), dequantize_ref(vc, vs)
        extra, extra_names = [ks, vs], ["float32", "float32"]
    else:
        if cache == "float16":
            kc, vc = np.zeros(shape, np.float16), np.zeros(shape, np.float16)
            k_held, v_held = key.astype(np.float16), value.astype(np.float16)
        else:
            kc, vc = np.zeros(shape, np.uint16), np.zeros(shape, np.uint16)
            (k_bits, k_held), (v_bits, v_held) = to_bfloat16_bits(key), to_bfloat16_bits(value)
        assert call(library.ReshapeAndCache, [key, value, kc, vc, slots, done],
                    ["float32", "float32", cache, cache, "int32", "int32"]) == 0
        held_k = kc.astype(np.float32) if cache == "float16" else (kc.astype(np.uint32) << 16).view(np.float32)
        held_v = vc.astype(np.float32) if cache == "float16" else (vc.astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_array_equal(held_k.reshape(-1, kv_heads, dim)[slots], np.asarray(k_held, np.float32))
        np.testing.assert_array_equal(held_v.reshape(-1, kv_heads, dim)[slots], np.asarray(v_held, np.float32))
        k_vals, v_vals = held_k, held_v
        extra, extra_names = [], []
    qsl = np.concatenate([[0], np.cumsum(queries)]).astype(np.int32)
    q = rng.standard_normal((int(qsl[-1]), heads, dim)).astype(np.float32)
    lens, scale = np.array(ctx, np.int32), np.array([dim ** -0.5], np.float32)
    out = np.full(q.shape, np.nan, np.float32)
    fn = library.PagedAttentionQuant if cache == "int8" else library.PagedAttention
    names = ["float32", cache, cache, "int32", "int32", "int32", "float32"] + extra_names + ["float32"]
    assert call(fn, [q, kc, vc, tables, lens, qsl, scale, *extra, out], names) == 0
    want = paged_attention_ref(q, k_vals, v_vals, tables, lens, qsl, float(scale[0]))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cache", [np.float32, np.float16])
def test_paged_attention_spans_of_long_contexts_on_each_isa(library, cache):
    """Decode rows over more than 1,024 tokens go in spans of 64 blocks whose partial softmaxes are combined: against
    numpy (contexts of one span exactly, one span and a token, several; decode rows, a 3-query tile, a 40-query
    prefill tile, which is not cut), and a sequence's rows bit for bit the same alone or in a batch."""
    rng = np.random.default_rng(7)
    heads, kv_heads, dim, bs = 9, 3, 64, 16
    ctx, queries = [2500, 1024, 1025, 1500], [1, 1, 3, 40]
    per_seq = -(-max(ctx) // bs)
    nb = 4 * per_seq + 3
    tables = rng.permutation(nb)[:4 * per_seq].reshape(4, per_seq).astype(np.int32)
    kc = rng.standard_normal((nb, bs, kv_heads, dim)).astype(cache)
    vc = rng.standard_normal((nb, bs, kv_heads, dim)).astype(cache)
    qsl = np.concatenate([[0], np.cumsum(queries)]).astype(np.int32)
    q = (rng.standard_normal((int(qsl[-1]), heads, dim)) * 3).astype(np.float32)
    lens, scale = np.array(ctx, np.int32), np.array([dim ** -0.5], np.float32)
    names = ["float32", cache.__name__, cache.__name__, "int32", "int32", "int32", "float32", "float32"]
    out = np.full(q.shape, np.nan, np.float32)
    assert call(library.PagedAttention, [q, kc, vc, tables, lens, qsl, scale, out], names) == 0
    want = paged_attention_ref(q, kc.astype(np.float32), vc.astype(np.float32), tables, lens, qsl, float(scale[0]))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    alone = np.full((1, heads, dim), np.nan, np.float32)
    assert call(library.PagedAttention, [q[:1], kc, vc, tables[:1], lens[:1], qsl[:2], scale, alone], names) == 0
    np.testing.assert_array_equal(alone, out[:1])


AVX512 = ("-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl")
# Each QuantDot path's flags, whatever -march=native adds: a -mno- takes away what the host's own flags would
# otherwise choose (on a VNNI host, BW without -mno-avx512vnni would build the VNNI path again).
DOT_PATHS = {"vnni": (AVX512 + ("-mavx512vnni",), {"avx512f", "avx512bw", "avx512_vnni"}),
             "bw": (AVX512 + ("-mno-avx512vnni",), {"avx512f", "avx512bw"}),
             "f_only": (("-mavx512f", "-mno-avx512bw", "-mno-avx512vnni"), {"avx512f"})}
_AVX512 = {}    # flags -> path of the library built with them


def avx512_library(tmp_path_factory, flags, runs: bool) -> str:
    """The GEMM-shaped kernels built with `flags` (once a process: the builds take most of these tests' time).
    A library this CPU runs holds QuantMatMul and QuantDot (quant_matmul.cc; PackedMatMul's AVX-512 tile is the
    native build's). A library this CPU cannot run is only compiled, PackedMatMul too, at -O0: errors in the
    AVX-512 code (an intrinsic that needs another flag fails when the always-inline intrinsic is inlined, at
    any -O) show all the same."""
    key = flags + (() if runs else ("-O0",))
    if key not in _AVX512:
        path = tmp_path_factory.mktemp("avx512") / "kernels.so"
        sources = ("quant_matmul.cc",) if runs else ("matmul.cc", "quant_matmul.cc")
        build.compile_library(path, key, sources=sources)
        assert build.is_complete_elf(path)
        _AVX512[key] = str(path)
    return _AVX512[key]


@pytest.mark.parametrize("variant", sorted(DOT_PATHS))
def test_avx512_quant_dot_compiles(tmp_path_factory, variant):
    """QuantDot's AVX-512 paths (VNNI dpbusd; BW maddubs + madd on 64 bytes; AVX-512F without BW: the AVX2
    integer path into zmm floats) build on any x86 CPU; they run, against the integer model, where the CPU
    has the instructions. On a host with AVX-512 VNNI the native build is the VNNI path, flag for flag: its
    installed library is the one checked."""
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("AVX-512 is an x86 instruction set")
    flags, needs = DOT_PATHS[variant]
    runs = needs <= _cpu_flags()
    if variant == "vnni" and runs:
        path = build.kernel_library()
    else:
        path = avx512_library(tmp_path_factory, flags, runs)
    if runs:
        lib = ctypes.CDLL(path)
        for fmt in sorted(DOT_KERNELS):
            for m, k, n in ((1, 576, 100), (5, 64, 40), (33, 96, 33)):
                check_quant_dot(lib, fmt, m, k, n)


def test_avx512_gemm_paths_compile(tmp_path_factory):
    """The AVX-512 tiles (PackedMatMul's panel pairs, QuantMatMul's dequantised pairs) build on any x86 CPU;
    they run, and are checked against numpy, where the CPU has AVX-512 (the native build above)."""
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("AVX-512 is an x86 instruction set")
    flags, needs = DOT_PATHS["bw"]          # one library with the BW QuantDot test
    runs = needs <= _cpu_flags()
    path = avx512_library(tmp_path_factory, flags, runs)
    if runs:
        lib = ctypes.CDLL(path)
        packed, w = packed_and_reference("q4_1", 64, 150, 9)
        for m in (1, 5, 13):                 # the GEMV (8 panels in flight, then 2 one by one), the tile
            x = np.random.default_rng(9).standard_normal((m, 64)).astype(np.float32)
            y = np.full((m, 160), np.nan, np.float32)
            assert build.call_kernel(lib.QuantMatMulQ4_1, [x, packed, y]) == 0
            np.testing.assert_allclose(y[:, :150], x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
