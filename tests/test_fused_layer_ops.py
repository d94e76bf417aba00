"""The fused ops of a decoder layer's CPU float32 path against numpy inside graph-mode Cells: AddRmsNorm (the
residual add and the next norm), LastTokenNorm (the final norm of each sequence's last token), RopeAndCache (rotary embedding, q/k/v split and the cache write, every cache
dtype), PagedAttention on [T, H * D], CachedAttention (both in one op); their argument checks; the model takes
the fused path only where it applies."""
import ctypes

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn

from ms_atb.models.llama import LlamaConfig, rope_tables
from ms_atb.models.llama_layers import LlamaAttention
from ms_atb.ops import AddRmsNorm, CachedAttention, LastTokenNorm, PagedAttention, RopeAndCache, build
from graph_helpers import Apply, close
from ops_reference import (dequantize_ref, paged_attention_ref, reshape_and_cache_int8_ref, reshape_and_cache_ref,
                           rms_norm_ref, rope_ref)

ms.set_context(mode=ms.GRAPH_MODE)

HEADS, KV_HEADS, D, BS, NB = 4, 2, 16, 4, 6
CACHE_DTYPES = {"float32": (ms.float32, np.float32), "float16": (ms.float16, np.float32),
                "bfloat16": (ms.bfloat16, np.float32), "int8": (ms.int8, np.int8)}


@pytest.mark.parametrize("t,h", [(5, 64), (300, 576)])
def test_add_rms_norm_fused(t, h):
    rng = np.random.default_rng(t)
    x = rng.standard_normal((t, h)).astype(np.float32)
    residual = rng.standard_normal((t, h)).astype(np.float32)
    residual[1] = -x[1]  # the sum is zero: eps keeps the norm finite, zeros out
    residual[2] *= 1e3
    weight = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
    op = AddRmsNorm(1e-6)
    assert op.fused
    s, y = (o.asnumpy() for o in Apply(op)(Tensor(x), Tensor(residual), Tensor(weight)))
    assert np.array_equal(s, x + residual)  # the sum exactly as MindSpore's Add gives it
    assert not y[1].any()
    close(y, rms_norm_ref(x + residual, weight, 1e-6), 1e-5)


def test_add_rms_norm_composite_float16():
    rng = np.random.default_rng(2)
    x, residual = (rng.standard_normal((5, 64)).astype(np.float16) for _ in range(2))
    weight = (1 + 0.1 * rng.standard_normal(64)).astype(np.float16)
    op = AddRmsNorm(1e-6, ms.float16)
    assert not op.fused
    s, y = (o.asnumpy() for o in Apply(op)(Tensor(x), Tensor(residual), Tensor(weight)))
    assert s.dtype == y.dtype == np.float16
    close(y, rms_norm_ref(x.astype(np.float32) + residual, weight, 1e-6), 5e-3)


@pytest.mark.parametrize("dtype", [ms.float32, ms.float16])
def test_last_token_norm(dtype):
    rng = np.random.default_rng(4)
    npt = np.float32 if dtype == ms.float32 else np.float16
    x, residual = (rng.standard_normal((8, 64)).astype(npt) for _ in range(2))
    weight = (1 + 0.1 * rng.standard_normal(64)).astype(npt)
    qsl = np.array([0, 3, 4, 7, 7, 7], np.int32)  # 3 real sequences, 2 padded ones (no token); rows 7.. padding
    op = LastTokenNorm(1e-6, dtype)
    assert op.fused == (dtype == ms.float32)
    y, seqs = (o.asnumpy() for o in Apply(op)(Tensor(x), Tensor(residual), Tensor(qsl), Tensor(weight)))
    assert y.shape == (5, 64) and seqs.tolist() == [3]
    rows = np.maximum(qsl[1:] - 1, 0)  # [2, 3, 6, 6, 6]
    close(y, rms_norm_ref((x + residual)[rows], weight, 1e-6), 1e-5 if dtype == ms.float32 else 5e-3)
    if dtype == ms.float32:  # a start past T is the kernel's error, not a read out of bounds
        outs = [np.zeros((1, 64), np.float32), np.zeros(1, np.int32)]
        eps = np.array([1e-6], np.float32)
        assert kernel_status("LastTokenNorm", [x, residual, np.array([0, 8], np.int32), weight, eps, *outs]) == 0
        assert kernel_status("LastTokenNorm", [x, residual, np.array([0, 9], np.int32), weight, eps, *outs]) != 0


class RopeCacheCell(nn.Cell):
    """RopeAndCache alone, over caches held as Parameters; returns q and the caches after the write."""

    def __init__(self, cache_dtype):
        super().__init__()
        self.quantized = cache_dtype == ms.int8
        zeros = np.zeros((NB, BS, KV_HEADS, D), np.int8 if self.quantized else np.float32)
        self.key_cache = Parameter(Tensor(zeros + (0 if self.quantized else 7), cache_dtype), name="key_cache")
        self.value_cache = Parameter(Tensor(zeros + (0 if self.quantized else 7), cache_dtype), name="value_cache")
        scales = np.full((NB, BS, KV_HEADS), 7.0, np.float32)
        self.key_scales = Parameter(Tensor(scales), name="key_scales") if self.quantized else None
        self.value_scales = Parameter(Tensor(scales), name="value_scales") if self.quantized else None
        self.op = RopeAndCache(self.quantized)

    def construct(self, qkv, cos, sin, perm, slot_mapping):
        return self.op(qkv, cos, sin, perm, self.key_cache, self.value_cache, slot_mapping, self.key_scales,
                       self.value_scales)


def rope_inputs(t, interleaved, seed):
    config = LlamaConfig(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=D,
                         max_position_embeddings=64, rope_interleaved=interleaved)
    cos, sin, perm = rope_tables(config)
    rng = np.random.default_rng(seed)
    positions = rng.integers(0, 64, t)
    qkv = rng.standard_normal((t, (HEADS + 2 * KV_HEADS) * D)).astype(np.float32)
    rotated = rope_ref(qkv[:, :(HEADS + KV_HEADS) * D].reshape(t, HEADS + KV_HEADS, D), positions,
                       config.rope_theta, interleaved)  # [T, H + KVH, D] float64
    return (qkv, cos[positions], sin[positions], perm), rotated


@pytest.mark.parametrize("cache", list(CACHE_DTYPES))
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_and_cache_matches_rope_then_write(cache, interleaved):
    t = 7
    inputs, rotated = rope_inputs(t, interleaved, [t, interleaved])
    slots = np.array([5, 0, -1, 23, 9, -1, 12], np.int32)  # scattered, two padding rows
    cell = RopeCacheCell(CACHE_DTYPES[cache][0])
    q = cell(*(Tensor(a) for a in inputs), Tensor(slots)).asnumpy()
    assert q.shape == (t, HEADS * D) and q.dtype == np.float32
    close(q, rotated[:, :HEADS].reshape(t, HEADS * D), 1e-5)
    key = rotated[:, HEADS:]  # [T, KVH, D]
    value = inputs[0][:, (HEADS + KV_HEADS) * D:].reshape(t, KV_HEADS, D)
    kc, vc = (c.float().asnumpy() if cache != "int8" else c.asnumpy() for c in (cell.key_cache, cell.value_cache))
    if cache == "int8":
        ks, vs = cell.key_scales.asnumpy(), cell.value_scales.asnumpy()
        ref_k, ref_v, ref_ks, ref_vs = reshape_and_cache_int8_ref(
            key.astype(np.float32), value, np.zeros_like(kc), np.zeros_like(vc), np.full(ks.shape, 7.0, np.float32),
            np.full(vs.shape, 7.0, np.float32), slots)
        assert np.array_equal(vc, ref_v) and np.array_equal(vs, ref_vs)  # v: the same float32 rows quantised
        assert np.array_equal(ks == 7.0, ref_ks == 7.0)  # untouched slots keep their scales
        # k: rotated in float32 by the kernel, in float64 by the reference; one int8 step apart at most
        close(dequantize_ref(kc, ks), dequantize_ref(ref_k, ref_ks), float(ks[ks != 7.0].max()) + 1e-6)
        return
    base = np.full(kc.shape, 7.0)
    ref_k, ref_v = reshape_and_cache_ref(key, value, base, base, slots)
    tol = 1e-5 if cache == "float32" else 1e-2
    close(kc, ref_k, tol)  # untouched slots keep their 7s
    close(vc, ref_v, tol)
    if cache == "float32":
        assert np.array_equal(vc, reshape_and_cache_ref(value, value, base, base, slots)[0])  # v copied exactly


class FlatAttend(nn.Cell):
    def __init__(self):
        super().__init__()
        self.pa = PagedAttention(HEADS, KV_HEADS, D, D ** -0.5)

    def construct(self, query, key_cache, value_cache, block_tables, context_lens, query_start_loc):
        return self.pa(query, key_cache, value_cache, block_tables, context_lens, query_start_loc)


def test_paged_attention_takes_a_flat_query():
    rng = np.random.default_rng(3)
    key_cache, value_cache = (rng.standard_normal((NB, BS, KV_HEADS, D)).astype(np.float32) for _ in range(2))
    tables = np.array([[2, 0, 5], [1, 3, 4]], np.int32)
    lens = np.array([9, 3], np.int32)
    qsl = np.array([0, 3, 4], np.int32)  # a 3-token chunk and a decode token; row 4 is padding
    query = rng.standard_normal((5, HEADS, D)).astype(np.float32)
    cell = FlatAttend()
    args = [Tensor(a) for a in (key_cache, value_cache, tables, lens, qsl)]
    flat = cell(Tensor(query.reshape(5, HEADS * D)), *args).asnumpy()
    assert flat.shape == (5, HEADS * D)
    ref = paged_attention_ref(query, key_cache, value_cache, tables, lens, qsl, D ** -0.5)
    close(flat, ref.reshape(5, HEADS * D), 1e-5)
    assert not flat[4].any()


class CachedCell(nn.Cell):
    """CachedAttention alone, over caches held as Parameters."""

    def __init__(self, cache_dtype):
        super().__init__()
        self.cache = RopeCacheCell(cache_dtype)  # holds the caches
        self.op = CachedAttention(D ** -0.5, cache_dtype == ms.int8)

    def construct(self, qkv, cos, sin, perm, slot_mapping, block_tables, context_lens, query_start_loc):
        c = self.cache
        return self.op(qkv, cos, sin, perm, c.key_cache, c.value_cache, slot_mapping, block_tables, context_lens,
                       query_start_loc, c.key_scales, c.value_scales)


class TwoOps(nn.Cell):
    """RopeAndCache then PagedAttention: what CachedAttention does in one op."""

    def __init__(self, cache_dtype):
        super().__init__()
        self.cache = RopeCacheCell(cache_dtype)
        self.pa = PagedAttention(HEADS, KV_HEADS, D, D ** -0.5, quantized=cache_dtype == ms.int8)

    def construct(self, qkv, cos, sin, perm, slot_mapping, block_tables, context_lens, query_start_loc):
        c = self.cache
        q = c(qkv, cos, sin, perm, slot_mapping)
        return self.pa(q, c.key_cache, c.value_cache, block_tables, context_lens, query_start_loc, c.key_scales,
                       c.value_scales)


@pytest.mark.parametrize("cache", list(CACHE_DTYPES))
def test_cached_attention_is_rope_and_cache_then_paged_attention(cache):
    # A 3-token prefill chunk after 6 cached tokens (blocks 2, 0, 5) and a decode token after 2 (block 1); row 4 is
    # padding. The rotary positions are random: the ops take the tables' rows as given.
    inputs, rotated = rope_inputs(5, False, 7)
    slots = np.array([0 * BS + 2, 0 * BS + 3, 5 * BS + 0, 1 * BS + 2, -1], np.int32)
    tables = np.array([[2, 0, 5], [1, 3, 4]], np.int32)
    lens = np.array([9, 3], np.int32)
    qsl = np.array([0, 3, 4], np.int32)
    args = [Tensor(a) for a in (*inputs, slots, tables, lens, qsl)]
    fused, two = CachedCell(CACHE_DTYPES[cache][0]), TwoOps(CACHE_DTYPES[cache][0])
    out = fused(*args).asnumpy()
    assert out.shape == (5, HEADS * D) and not out[4].any()
    assert np.array_equal(out, two(*args).asnumpy())
    for name in ("key_cache", "value_cache") + (("key_scales", "value_scales") if cache == "int8" else ()):
        assert np.array_equal(getattr(fused.cache, name).float().asnumpy(), getattr(two.cache, name).float().asnumpy())
    if cache == "float32":  # against numpy: caches hold 7s where nothing was written
        key = rotated[:, HEADS:]
        value = inputs[0][:, (HEADS + KV_HEADS) * D:].reshape(5, KV_HEADS, D)
        base = np.full((NB, BS, KV_HEADS, D), 7.0)
        kc, vc = reshape_and_cache_ref(key, value, base, base, slots)
        ref = paged_attention_ref(rotated[:, :HEADS], kc, vc, tables, lens, qsl, D ** -0.5)
        close(out, ref.reshape(5, HEADS * D), 1e-5)


def kernel_status(name, arrays):
    return build.call_kernel(getattr(ctypes.CDLL(build.kernel_library()), name), arrays)


def test_rope_and_cache_rejects_bad_arguments():
    (qkv, cos, sin, perm), _ = rope_inputs(3, False, 0)
    caches = [np.zeros((NB, BS, KV_HEADS, D), np.float32) for _ in range(2)]
    slots = np.array([0, 1, 2], np.int32)

    def status(qkv=qkv, cos=cos, sin=sin, perm=perm, slots=slots, caches=caches, out_width=HEADS * D):
        out = np.zeros((len(qkv), out_width), np.float32)
        return kernel_status("RopeAndCache", [qkv, cos, sin, perm, *caches, slots, out])
    assert status() == 0
    assert status(qkv=qkv[:, :2 * KV_HEADS * D]) != 0            # no query head left
    assert status(qkv=qkv[:, :-1].copy()) != 0                    # width not a multiple of D
    assert status(cos=cos[:2].copy()) != 0                        # a table row short
    assert status(perm=np.full(D, D, np.int32)) != 0              # perm out of [0, D)
    assert status(slots=np.array([0, 1, NB * BS], np.int32)) != 0  # past the cache
    assert status(caches=[c.astype(np.int8) for c in caches]) != 0  # int8 needs the Quant form's scales
    assert status(slots=slots.astype(np.int64)) != 0
    tables, lens, qsl, scale = np.zeros((1, 2), np.int32), np.array([3], np.int32), np.array([0, 3], np.int32), \
        np.array([D ** -0.5], np.float32)
    out = np.zeros((3, HEADS * D), np.float32)
    assert kernel_status("CachedAttention", [qkv, cos, sin, perm, *caches, slots, tables, lens, qsl, scale, out]) == 0
    assert kernel_status("CachedAttention", [qkv, cos, sin, perm, *caches, slots, tables, lens[:0], qsl, scale,
                                             out]) != 0  # the attention's own checks run too


@pytest.mark.parametrize("dtype,backend,fused", [(ms.float32, "cpu", True), (ms.float32, None, True),
                                                  (ms.float16, "cpu", False), (ms.float16, "ascendc", False)])
def test_attention_fuses_only_on_the_cpu_backend_in_float32(dtype, backend, fused):
    config = LlamaConfig(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=D)
    attn = LlamaAttention(config, dtype, "cpu", 1, 0, backend)
    assert attn.fused == fused
    assert hasattr(attn, "cached_attn") == fused and hasattr(attn, "reshape_and_cache") != fused
