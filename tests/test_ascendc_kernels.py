"""The AscendC kernels (ops/ascendc/op_kernel), compiled by g++ against our CPU implementation of the Ascend
C API subset and run core after core with op_host's tiling, against the numpy references.

Tolerances: the kernels compute in float32 from the stored 16-bit values and round the output once, so
against the float64 reference over the same stored values |error| <= tol * max(1, |reference|) with tol
2^-10 for float16 (twice its half-ulp) and 2^-7 for bfloat16 (twice its half-ulp)."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from ascendc_helpers import make_batch, paged_attention, storage, values, call
from ms_atb import ops as ms_ops
from ops_reference import (dequantize_ref, paged_attention_ref, reshape_and_cache_int8_ref, reshape_and_cache_ref)

TOLERANCE = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
# (num_heads, num_kv_heads, head_dim, block_size, num_blocks): the CPU kernels' grid (tests/test_ops.py),
# then GQA 32/8 with head_dim 128 in blocks of 128 and of 16.
CONFIGS = {"mha": (4, 4, 16, 16, 300), "gqa3": (9, 3, 64, 16, 300), "gqa4": (8, 2, 32, 32, 160),
           "gqa8_bs128": (32, 8, 128, 128, 40), "gqa8_bs16": (32, 8, 128, 16, 300)}
# (context_len, num_queries): decodes, prefill chunks over cached prefixes, whole prompts, a padded sequence.
MIXED = [(1, 1), (17, 1), (16, 1), (300, 1), (40, 40), (100, 37), (48, 16), (0, 0), (33, 2), (700, 1)]
LONG = [(2048, 1), (1100, 8), (5, 5)]
LONGER = [(2048, 1), (1500, 24), (129, 129), (5, 5)]


def check(name, seqs, layout, dtype, seed):
    h, kvh, d, bs, nb = CONFIGS[name]
    rng = np.random.default_rng(seed)
    kc = storage(rng.standard_normal((nb, bs, kvh, d)), dtype)
    vc = storage(rng.standard_normal((nb, bs, kvh, d)), dtype)
    query, tables, lens, qsl = make_batch(rng, seqs, h, kvh, d, bs, nb, layout, pad_rows=3)
    query = storage(query, dtype)
    status, out = paged_attention(query, kc, vc, tables, lens, qsl, d ** -0.5, dtype)
    assert status == 0
    ref = paged_attention_ref(values(query, dtype), values(kc, dtype), values(vc, dtype), tables, lens, qsl,
                              d ** -0.5)
    got = values(out, dtype).astype(np.float64)
    assert np.all(np.abs(got - ref) <= TOLERANCE[dtype] * np.maximum(1.0, np.abs(ref)))
    assert not got[qsl[-1]:].any()  # rows owned by no sequence are zero


def tiling_of(name, seqs, cache_dtype="float16"):
    h, kvh, d, bs, _ = CONFIGS[name]
    return ms_ops.ascendc_tiling("paged_attention", num_tokens=sum(q for _, q in seqs), num_heads=h, num_kv_heads=kvh,
                                 head_dim=d, block_size=bs, num_seqs=len(seqs), max_context=max(c for c, _ in seqs),
                                 dtype="float16", cache_dtype=cache_dtype)


def grid():
    """Every config, layout and dtype; the GQA 32/8 ones beyond two combinations each are marked slow."""
    for name in CONFIGS:
        for layout in ("contiguous", "scattered"):
            for dtype in ("float16", "bfloat16"):
                big = name.startswith("gqa8") and (layout == "scattered") != (dtype == "float16")
                yield pytest.param(name, layout, dtype, marks=[pytest.mark.slow] if big else [])


@pytest.mark.parametrize("name, layout, dtype", list(grid()))
def test_paged_attention_matches_reference(name, layout, dtype):
    seqs = MIXED if name in ("gqa3", "gqa8_bs128") else MIXED[:5] + [(64, 9), (3, 1)]
    check(name, seqs, layout, dtype, [len(name), len(layout), len(dtype)])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_long_contexts_with_ragged_chunks(dtype):
    check("gqa8_bs128", LONG, "scattered", dtype, 7)


@pytest.mark.slow
@pytest.mark.parametrize("name, seqs", [("gqa8_bs128", LONGER), ("gqa8_bs16", [(2048, 200), (900, 33)]),
                                        ("gqa3", [(2048, 300), (1024, 1), (600, 64)])])
def test_long_prefill_chunks(name, seqs):
    check(name, seqs, "scattered", "bfloat16" if name == "gqa8_bs128" else "float16", 11)


@pytest.mark.parametrize("name, seqs, dtype", [("gqa4", [(4000, 1)], "float16"), ("gqa3", [(3000, 3)], "bfloat16")])
def test_one_long_context_split_across_cores(name, seqs, dtype):
    """One sequence: fewer work items than cores, so the tiling splits the context over several cores and the
    merged parts equal the reference (a decode on the vector unit; a prefill chunk on the Cube)."""
    plan = tiling_of(name, seqs)
    assert plan["kv_splits"] > 1 and plan["block_dim"] > plan["base_items"]
    assert plan["cube"] == (seqs[0][1] > 1)
    check(name, seqs, "scattered", dtype, 13)


def int8_batch(name, seqs, dtype, seed):
    """float rows quantised into int8 caches by the AscendC kernel (checked bit for bit against the quantising
    reference), then the queries: -> the caches, scales, query, tables, lens, qsl and the reference rows."""
    h, kvh, d, bs, nb = CONFIGS[name]
    rng = np.random.default_rng(seed)
    query, tables, lens, qsl = make_batch(rng, seqs, h, kvh, d, bs, nb, "scattered")
    slots = np.concatenate([tables[b, np.arange(c) // bs] * bs + np.arange(c) % bs for b, (c, _) in enumerate(seqs)])
    key = storage(rng.standard_normal((len(slots), kvh, d)) * rng.uniform(0.1, 4, (len(slots), kvh, 1)), dtype)
    value = storage(rng.standard_normal((len(slots), kvh, d)), dtype)
    key[1, 0] = 0  # an all-zero row: q 0, scale 0
    kc, vc = np.zeros((nb, bs, kvh, d), np.int8), np.zeros((nb, bs, kvh, d), np.int8)
    ks, vs = np.zeros((nb, bs, kvh), np.float32), np.zeros((nb, bs, kvh), np.float32)
    want = reshape_and_cache_int8_ref(values(key, dtype), values(value, dtype), kc.copy(), vc.copy(), ks.copy(),
                                      vs.copy(), slots.astype(np.int32))
    done = np.zeros(1, np.int32)
    assert call("MsAtbReshapeAndCacheQuant", [key, value, kc, vc, slots.astype(np.int32), ks, vs, done],
                [dtype, dtype, "int8", "int8", "int32", "float32", "float32", "int32"]) == 0
    for got, ref in zip((kc, vc, ks, vs), want):
        np.testing.assert_array_equal(got, ref)
    return kc, vc, ks, vs, storage(query, dtype), tables, lens, qsl


@pytest.mark.parametrize("name, dtype, seqs", [("gqa4", "float16", [(70, 1), (40, 40), (300, 1), (33, 5)]),
                                               ("gqa8_bs16", "bfloat16", [(70, 1), (40, 40), (300, 1), (33, 5)]),
                                               ("gqa4", "float16", [(3000, 1)])])
def test_int8_caches_quantised_on_write_and_dequantised_in_attention(name, dtype, seqs):
    """The int8 scale layout of ops/reshape_and_cache.cc ((block * BS + offset) * KVH + head, float32, per token
    and KV head); attention over the dequantised values within the output dtype's tolerance (the kernel
    dequantises exactly: int8 -> float16 -> float32, times the scale); one long context split over cores."""
    d = CONFIGS[name][2]
    assert tiling_of(name, seqs, "int8")["kv_splits"] > 1 or len(seqs) > 1   # one sequence: split over cores
    kc, vc, ks, vs, query, tables, lens, qsl = int8_batch(name, seqs, dtype, 3)
    out = np.full(query.shape, 0x7E00 if dtype == "float16" else 0x7FC0, np.uint16).view(query.dtype)
    status = call("MsAtbPagedAttentionQuant",
                  [query, kc, vc, tables, lens, qsl, np.array([d ** -0.5], np.float32), ks, vs, out],
                  [dtype, "int8", "int8"] + ["int32"] * 3 + ["float32"] * 3 + [dtype])
    assert status == 0
    ref = paged_attention_ref(values(query, dtype), dequantize_ref(kc, ks), dequantize_ref(vc, vs), tables, lens, qsl,
                              d ** -0.5)
    got = values(out, dtype).astype(np.float64)
    assert np.all(np.abs(got - ref) <= TOLERANCE[dtype] * np.maximum(1.0, np.abs(ref)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kvh, d", [(2, 16), (8, 128), (3, 64)])
def test_reshape_and_cache_writes_bit_for_bit(kvh, d, dtype):
    rng = np.random.default_rng(kvh * d)
    nb, bs = 10, 16
    kc, vc = (storage(rng.standard_normal((nb, bs, kvh, d)), dtype) for _ in range(2))
    key, value = (storage(rng.standard_normal((7, kvh, d)), dtype) for _ in range(2))
    slots = np.array([3, -1, 159, 17, 16, -5, 80], np.int32)
    new_kc, new_vc, done = kc.copy(), vc.copy(), np.zeros(1, np.int32)
    assert call("MsAtbReshapeAndCache", [key, value, new_kc, new_vc, slots, done], [dtype] * 4 + ["int32"] * 2) == 0
    ref_k, ref_v = reshape_and_cache_ref(key, value, kc, vc, slots)
    assert np.array_equal(new_kc, ref_k) and np.array_equal(new_vc, ref_v) and done[0] == 1


def test_bad_arguments_are_errors_not_crashes():
    h, kvh, d, bs, nb = CONFIGS["mha"]
    q = storage(np.zeros((1, h, d)), "float16")
    kc = storage(np.zeros((nb, bs, kvh, d)), "float16")
    i32 = lambda *x: np.array(x, np.int32)  # noqa: E731
    assert paged_attention(q, kc, kc, np.array([[nb]], np.int32), i32(1), i32(0, 1), 0.25, "float16")[0] == 1
    assert paged_attention(q, kc, kc, np.array([[0]], np.int32), i32(1), i32(0, 1), 0.25, "float32")[0] == 1


@pytest.mark.parametrize("dtype", [ms.float16, ms.bfloat16])
def test_functional_forms_run_the_ascendc_kernels(dtype):
    """ms_atb.ops.reshape_and_cache / paged_attention with backend="ascendc", through ops.Custom aot."""
    rng = np.random.default_rng(5)
    h, kvh, d, bs, nb = 8, 2, 64, 16, 12
    kc = Tensor(np.zeros((nb, bs, kvh, d), np.float32)).astype(dtype)
    vc = Tensor(np.zeros((nb, bs, kvh, d), np.float32)).astype(dtype)
    key, value = (Tensor(rng.standard_normal((20, kvh, d)).astype(np.float32)).astype(dtype) for _ in range(2))
    slots = np.array([5 * bs + i for i in range(16)] + [2 * bs + i for i in range(4)], np.int32)
    ms_ops.reshape_and_cache(key, value, kc, vc, Tensor(slots), backend="ascendc")
    f32 = lambda t: t.astype(ms.float32).asnumpy()  # noqa: E731
    zeros = np.zeros((nb, bs, kvh, d), np.float32)
    kc_ref, vc_ref = reshape_and_cache_ref(f32(key), f32(value), zeros, zeros, slots)
    assert np.array_equal(f32(kc), kc_ref) and np.array_equal(f32(vc), vc_ref)
    query = Tensor(rng.standard_normal((4, h, d)).astype(np.float32)).astype(dtype)
    args = (np.array([[5, 2], [5, 0]], np.int32), np.array([20, 9], np.int32), np.array([0, 3, 4], np.int32))
    out = ms_ops.paged_attention(query, kc, vc, *(Tensor(a) for a in args), 0.125, backend="ascendc")
    assert out.dtype == dtype
    ref = paged_attention_ref(f32(query), kc_ref, vc_ref, *args, 0.125)
    tol = TOLERANCE["float16" if dtype == ms.float16 else "bfloat16"]
    assert np.all(np.abs(f32(out) - ref) <= tol * np.maximum(1.0, np.abs(ref)))


def test_functional_forms_take_int8_caches_on_the_ascendc_backend():
    """backend="ascendc" with int8 caches and their scales, called as the cpu backend is: the same caches, scales
    and (within float16 rounding) the same attention as backend="cpu"."""
    rng = np.random.default_rng(6)
    h, kvh, d, bs, nb = 4, 2, 32, 16, 8
    key, value = (rng.standard_normal((20, kvh, d)).astype(np.float16) for _ in range(2))
    slots = Tensor(np.array([3 * bs + i for i in range(16)] + [bs + i for i in range(4)], np.int32))
    args = (np.array([[3, 1], [3, 0]], np.int32), np.array([20, 9], np.int32), np.array([0, 3, 4], np.int32))
    query = Tensor(rng.standard_normal((4, h, d)).astype(np.float16))
    results = {}
    for backend in ("cpu", "ascendc"):
        caches = [Tensor(np.zeros((nb, bs, kvh, d), np.int8)) for _ in range(2)]
        scales = [Tensor(np.zeros((nb, bs, kvh), np.float32)) for _ in range(2)]
        ms_ops.reshape_and_cache(Tensor(key), Tensor(value), *caches, slots, *scales, backend=backend)
        out = ms_ops.paged_attention(query, *caches, *(Tensor(a) for a in args), 0.2, *scales, backend=backend)
        results[backend] = [x.asnumpy() for x in caches + scales] + [out.astype(ms.float32).asnumpy()]
    for cpu, ascendc in zip(results["cpu"][:4], results["ascendc"][:4]):
        np.testing.assert_array_equal(cpu, ascendc)
    ref = results["cpu"][4]
    assert np.all(np.abs(results["ascendc"][4] - ref) <= TOLERANCE["float16"] * np.maximum(1.0, np.abs(ref)))


def test_functional_forms_refuse_what_the_ascendc_kernels_cannot_run():
    f32 = Tensor(np.zeros((1, 2, 16), np.float32))
    cache = Tensor(np.zeros((2, 16, 2, 16), np.float32))
    i32 = lambda *x: Tensor(np.array(x, np.int32))  # noqa: E731
    with pytest.raises(ValueError, match="backend 'ascendc' takes float16 or bfloat16 tensors, query is Float32"):
        ms_ops.paged_attention(f32, cache, cache, i32([0]), i32(1), i32(0, 1), 0.25, backend="ascendc")
    half = Tensor(np.zeros((1, 2, 8), np.float16))
    with pytest.raises(ValueError, match="head_dim must be a multiple of 16, got 8"):
        ms_ops.reshape_and_cache(half, half, Tensor(np.zeros((2, 16, 2, 8), np.float16)),
                                 Tensor(np.zeros((2, 16, 2, 8), np.float16)), i32(0), backend="ascendc")
    i8 = Tensor(np.zeros((2, 16, 2, 16), np.int8))
    f32s = Tensor(np.zeros((2, 16, 2), np.float32))
    with pytest.raises(ValueError, match="head_dim must be a multiple of 32 with an int8 cache, got 16"):
        ms_ops.reshape_and_cache(half16 := Tensor(np.zeros((1, 2, 16), np.float16)), half16, i8, i8, i32(0), f32s, f32s,
                                 backend="ascendc")
    with pytest.raises(ValueError, match="backend 'ascendc' takes caches of query's dtype Float16 or int8, got BFloat16"):
        bf = Tensor(np.zeros((2, 16, 2, 16), np.float32)).astype(ms.bfloat16)
        ms_ops.paged_attention(half16, bf, bf, i32([0]), i32(1), i32(0, 1), 0.25, backend="ascendc")
    with pytest.raises(ValueError, match=r"attention_backend 'ms_atb' does not run on device 'cpu'; allowed there"):
        ms_ops.paged_attention(f32, cache, cache, i32([0]), i32(1), i32(0, 1), 0.25, backend="ms_atb")
