"""ms_atb.ops.reshape_and_cache / paged_attention: the functional signatures of docs/design.md, checked arguments."""
import numpy as np
import pytest
from mindspore import Tensor

from ms_atb.ops import paged_attention, reshape_and_cache
from ops_reference import (dequantize_ref, paged_attention_ref, reshape_and_cache_int8_ref,
                           reshape_and_cache_ref)

NB, BS, H, KVH, D = 12, 4, 4, 2, 8


def i32(x):
    return Tensor(np.asarray(x, np.int32))


def setup_caches(seed=0):
    """Fills the caches through reshape_and_cache: sequence 0 holds 9 tokens in blocks [5, 2, 9], sequence 1
    holds 6 tokens in blocks [0, 1]; two padding rows (slot -1) are skipped."""
    rng = np.random.default_rng(seed)
    slots = [5 * BS + i for i in range(4)] + [2 * BS + i for i in range(4)] + [9 * BS] + list(range(6)) + [-1, -1]
    key = rng.standard_normal((len(slots), KVH, D)).astype(np.float32)
    value = rng.standard_normal((len(slots), KVH, D)).astype(np.float32)
    kc = Tensor(np.zeros((NB, BS, KVH, D), np.float32))
    vc = Tensor(np.zeros((NB, BS, KVH, D), np.float32))
    reshape_and_cache(Tensor(key), Tensor(value), kc, vc, i32(slots))
    return kc, vc, reshape_and_cache_ref(key, value, np.zeros((NB, BS, KVH, D), np.float32),
                                         np.zeros((NB, BS, KVH, D), np.float32), slots)


def test_the_functional_forms_match_the_references():
    kc, vc, (kc_ref, vc_ref) = setup_caches()
    np.testing.assert_array_equal(kc.asnumpy(), kc_ref)
    np.testing.assert_array_equal(vc.asnumpy(), vc_ref)
    query = np.random.default_rng(1).standard_normal((4, H, D)).astype(np.float32)
    # sequence 0 decodes its 9th token, sequence 1 computes its last 3 tokens, sequence 2 has no queries
    args = ([[5, 2, 9], [0, 1, 0], [0, 0, 0]], [9, 6, 0], [0, 1, 4, 4])
    out = paged_attention(Tensor(query), kc, vc, *(i32(a) for a in args), 0.3)
    ref = paged_attention_ref(query, kc_ref, vc_ref, *(np.asarray(a) for a in args), 0.3)
    np.testing.assert_allclose(out.asnumpy(), ref, atol=1e-5)


def test_bfloat16_caches_on_the_cpu():
    """bfloat16 tokens and caches: written bit for bit, attention computed in float32 and rounded once."""
    import mindspore as ms
    rng = np.random.default_rng(3)
    kc, vc, (kc_ref, vc_ref) = setup_caches()

    def to_bf16(x):
        return Tensor(np.asarray(x, np.float32)).astype(ms.bfloat16)
    kc16, vc16 = to_bf16(kc_ref), to_bf16(vc_ref)
    kc_r, vc_r = (t.astype(ms.float32).asnumpy() for t in (kc16, vc16))           # the values bf16 holds
    key = rng.standard_normal((2, KVH, D)).astype(np.float32)
    value = rng.standard_normal((2, KVH, D)).astype(np.float32)
    reshape_and_cache(to_bf16(key), to_bf16(value), kc16, vc16, i32([9 * BS + 1, 9 * BS + 2]))
    key_r, value_r = (to_bf16(x).astype(ms.float32).asnumpy() for x in (key, value))
    kc_r, vc_r = reshape_and_cache_ref(key_r, value_r, kc_r, vc_r, [9 * BS + 1, 9 * BS + 2])
    assert kc16.dtype == ms.bfloat16
    np.testing.assert_array_equal(kc16.astype(ms.float32).asnumpy(), kc_r)
    np.testing.assert_array_equal(vc16.astype(ms.float32).asnumpy(), vc_r)
    query = to_bf16(rng.standard_normal((3, H, D)))
    args = ([[5, 2, 9], [0, 1, 0]], [11, 6], [0, 2, 3])
    out = paged_attention(query, kc16, vc16, *(i32(a) for a in args), 0.3)
    assert out.dtype == ms.bfloat16
    ref = paged_attention_ref(query.astype(ms.float32).asnumpy(), kc_r, vc_r, *(np.asarray(a) for a in args), 0.3)
    np.testing.assert_allclose(out.astype(ms.float32).asnumpy(), ref, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("change, match", [
    (dict(block_tables=[[5, 2, 12], [0, 1, 0], [0, 0, 0]]), "sequence 0: block_tables names block 12, outside"),
    (dict(block_tables=[[5, 2, -1], [0, 1, 0], [0, 0, 0]]), "sequence 0: block_tables names block -1"),
    (dict(context_lens=[9, 2, 0]), "sequence 1: context_lens 2 is shorter than its 3 queries"),
    (dict(context_lens=[13, 6, 0]), "sequence 0: 13 tokens need 4 blocks, block_tables has 3"),
    (dict(query_start_loc=[0, 3, 1, 4]), "query_start_loc must rise"),
    (dict(query_start_loc=[0, 1, 4, 5]), r"query_start_loc must rise from >= 0 to at most T = 4"),
    (dict(query_start_loc=[0, 1, 4]), r"query_start_loc must have shape \(4,\)"),
    (dict(context_lens=np.array([9, 6, 0], np.int64)), "context_lens must be an int32 mindspore Tensor"),
    (dict(scale=float("nan")), "scale must be a finite number"),
    (dict(query=np.zeros((4, 3, D), np.float32)), "query's 3 heads must be a multiple of the caches' 2 KV heads"),
])
def test_bad_attention_arguments_are_value_errors_and_leave_the_op_usable(change, match):
    kc, vc, (kc_ref, vc_ref) = setup_caches()
    query = np.random.default_rng(1).standard_normal((4, H, D)).astype(np.float32)
    args = dict(query=query, block_tables=[[5, 2, 9], [0, 1, 0], [0, 0, 0]], context_lens=[9, 6, 0],
                query_start_loc=[0, 1, 4, 4], scale=0.3)

    def call(a):
        return paged_attention(Tensor(a["query"]), kc, vc, *(Tensor(a[k]) if isinstance(a[k], np.ndarray)
                                                             else i32(a[k]) for k in
                                                             ("block_tables", "context_lens", "query_start_loc")),
                               a["scale"])
    with pytest.raises(ValueError, match=match):
        call(dict(args, **change))
    ref = paged_attention_ref(query, kc_ref, vc_ref, np.asarray(args["block_tables"]),
                              np.asarray(args["context_lens"]), np.asarray(args["query_start_loc"]), 0.3)
    np.testing.assert_allclose(call(args).asnumpy(), ref, atol=1e-5)


def test_bad_cache_writes_are_value_errors_and_change_nothing():
    kc, vc, (kc_ref, _) = setup_caches()
    key = Tensor(np.ones((2, KVH, D), np.float32))
    for slots, match in (([0, NB * BS], "slot_mapping holds 48, past the cache's 48 slots"),
                         ([0], r"slot_mapping must have shape \(2,\)"),
                         (np.array([0, 1], np.int64), "slot_mapping must be an int32 mindspore Tensor")):
        with pytest.raises(ValueError, match=match):
            reshape_and_cache(key, key, kc, vc, Tensor(slots) if isinstance(slots, np.ndarray) else i32(slots))
    with pytest.raises(ValueError, match="value .* must match key"):
        reshape_and_cache(key, Tensor(np.ones((2, KVH, D + 1), np.float32)), kc, vc, i32([0, 1]))
    with pytest.raises(ValueError, match="the caches hold 2 KV heads of 8, the tokens 1 of 8"):
        reshape_and_cache(Tensor(np.ones((2, 1, D), np.float32)), Tensor(np.ones((2, 1, D), np.float32)),
                          kc, vc, i32([0, 1]))
    np.testing.assert_array_equal(kc.asnumpy(), kc_ref)
    reshape_and_cache(key, key, kc, vc, i32([3, -1]))
    assert (kc.asnumpy()[0, 3] == 1).all() and (kc.asnumpy()[np.arange(NB) != 0] == kc_ref[np.arange(NB) != 0]).all()


def int8_caches():
    """Empty int8 caches [NB, BS, KVH, D] and their scales [NB, BS, KVH], as Tensors."""
    return (Tensor(np.zeros((NB, BS, KVH, D), np.int8)), Tensor(np.zeros((NB, BS, KVH, D), np.int8)),
            Tensor(np.zeros((NB, BS, KVH), np.float32)), Tensor(np.zeros((NB, BS, KVH), np.float32)))


def test_int8_caches_against_the_quantising_reference():
    """float32 rows quantised per (token, KV head) on the write, exactly as the reference does it; the attention
    equals the reference's over the dequantised values (float32 rounding only), and differs from attention over
    the unquantised rows by at most what per-row scaling implies: each value moves by at most half a step,
    max|row| / 254, so each output by at most max|v| / 254 through V plus max|v| * sum|dp| through the scores,
    whose shifts are at most scale * sum_d |q_d| * max|k| / 254 (|dp|_1 <= 2 max|ds| to first order)."""
    rng = np.random.default_rng(4)
    slots = [5 * BS + i for i in range(4)] + [2 * BS + i for i in range(4)] + [9 * BS] + list(range(6)) + [-1]
    key = (rng.standard_normal((len(slots), KVH, D)) * rng.uniform(0.1, 4, (len(slots), KVH, 1))).astype(np.float32)
    value = rng.standard_normal((len(slots), KVH, D)).astype(np.float32)
    key[2, 0] = 0.0                                                    # an all-zero row: q 0, scale 0
    kc, vc, ks, vs = int8_caches()
    reshape_and_cache(Tensor(key), Tensor(value), kc, vc, i32(slots), ks, vs)
    want = reshape_and_cache_int8_ref(key, value, *(x.asnumpy() for x in int8_caches()), slots)
    for got, ref in zip((kc, vc, ks, vs), want):
        np.testing.assert_array_equal(got.asnumpy(), ref)
    assert ks.asnumpy()[5, 2, 0] == 0 and not kc.asnumpy()[5, 2, 0].any()
    query = rng.standard_normal((4, H, D)).astype(np.float32)
    args = ([[5, 2, 9], [0, 1, 0], [0, 0, 0]], [9, 6, 0], [0, 1, 4, 4])
    out = paged_attention(Tensor(query), kc, vc, *(i32(a) for a in args), 0.3, ks, vs).asnumpy()
    ref = paged_attention_ref(query, dequantize_ref(want[0], want[2]), dequantize_ref(want[1], want[3]),
                              *(np.asarray(a) for a in args), 0.3)
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)
    kf, vf = reshape_and_cache_ref(key, value, np.zeros((NB, BS, KVH, D), np.float32),
                                   np.zeros((NB, BS, KVH, D), np.float32), slots)
    exact = paged_attention_ref(query, kf, vf, *(np.asarray(a) for a in args), 0.3)
    kmax, vmax = np.abs(key).max(), np.abs(value).max()
    ds = 0.3 * np.abs(query).sum(-1).max() * kmax / 254
    bound = vmax / 254 + vmax * 2 * ds
    err = np.abs(out - exact).max()
    assert 0 < err <= bound, (err, bound)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_narrow_float_caches_under_float32_tokens(dtype):
    """float32 rows into float16 / bfloat16 caches: rounded once on the write, attention in float32 over the values
    held, float32 out."""
    import mindspore as ms
    rng = np.random.default_rng(5)
    cast = getattr(ms, dtype)
    slots = list(range(9))
    key = rng.standard_normal((9, KVH, D)).astype(np.float32)
    value = rng.standard_normal((9, KVH, D)).astype(np.float32)
    kc = Tensor(np.zeros((NB, BS, KVH, D), np.float32)).astype(cast)
    vc = Tensor(np.zeros((NB, BS, KVH, D), np.float32)).astype(cast)
    reshape_and_cache(Tensor(key), Tensor(value), kc, vc, i32(slots))
    held = [Tensor(x).astype(cast).astype(ms.float32).asnumpy() for x in (key, value)]
    kr, vr = reshape_and_cache_ref(*held, np.zeros((NB, BS, KVH, D), np.float32), np.zeros((NB, BS, KVH, D), np.float32),
                                   slots)
    np.testing.assert_array_equal(kc.astype(ms.float32).asnumpy(), kr)
    query = rng.standard_normal((2, H, D)).astype(np.float32)
    args = ([[0, 1, 2]], [9], [0, 2])
    out = paged_attention(Tensor(query), kc, vc, *(i32(a) for a in args), 0.3)
    assert out.dtype == ms.float32
    ref = paged_attention_ref(query, kr, vr, *(np.asarray(a) for a in args), 0.3)
    np.testing.assert_allclose(out.asnumpy(), ref, atol=1e-5, rtol=1e-5)


def test_int8_caches_need_their_scales():
    kc, vc, ks, vs = int8_caches()
    key = Tensor(np.ones((2, KVH, D), np.float32))
    with pytest.raises(ValueError, match=r"int8 caches need key_scale_cache, a float32 Tensor \[NB, BS, KVH\]"):
        reshape_and_cache(key, key, kc, vc, i32([0, 1]))
    with pytest.raises(ValueError, match="int8 caches need value_scale_cache.*got Float32 \\(12, 4, 3\\)"):
        reshape_and_cache(key, key, kc, vc, i32([0, 1]), ks, Tensor(np.zeros((NB, BS, 3), np.float32)))
    f32 = Tensor(np.zeros((NB, BS, KVH, D), np.float32))
    with pytest.raises(ValueError, match="key_scale_cache and value_scale_cache go with int8 caches, not Float32"):
        paged_attention(Tensor(np.ones((1, H, D), np.float32)), f32, f32, i32([[0]]), i32([1]), i32([0, 1]), 0.3,
                        ks, vs)
    with pytest.raises(ValueError, match="key must be float32, float16 or bfloat16, got Int8"):
        reshape_and_cache(Tensor(np.ones((2, KVH, D), np.int8)), Tensor(np.ones((2, KVH, D), np.int8)), kc, vc,
                          i32([0, 1]), ks, vs)
