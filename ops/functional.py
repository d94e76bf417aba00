"""The functional forms of the two KV-cache ops (docs/design.md), for eager callers (scripts, tests, notebooks).

    reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, backend=None)             # in place
    paged_attention(query, key_cache, value_cache, block_tables, context_lens, query_start_loc, scale, backend=None)
    ascendc_tiling(op, **shape)       # the op_host tiling of the AscendC kernels for a shape

backend: None (the device's default), or one of ms_atb/attention_backends.py's for the device ("cpu" or "ascendc" on
the CPU, "ms_atb" or "mindspore" on Ascend).

The caches' dtype is independent of the tokens' (float32, float16, bfloat16, or int8 with key_scale_cache and
value_scale_cache [NB, BS, KVH] float32, passed as the last two arguments of both); backend "ascendc" takes
caches of the tokens' dtype or int8 (head_dim a multiple of 32).

The model's graphs use the Cells (ReshapeAndCache, PagedAttention) directly. These wrappers check every
argument on the host first, so a bad call is a ValueError naming the argument instead of a kernel error
code (which in graph mode would also leave that compiled graph unusable), then run a cached Cell.
"""
from __future__ import annotations

import functools
import math

import mindspore as ms
import numpy as np

from ms_atb.ops.backends import resolve_backend
from ms_atb.ops.paged_attention import PagedAttention
from ms_atb.ops.reshape_and_cache import ReshapeAndCache


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, key_scale_cache=None,
                      value_scale_cache=None, backend=None):
    """key, value [T, KVH, D]; key_cache, value_cache [NB, BS, KVH, D] (whole tensors: written in place);
    slot_mapping [T] int32, slot = block_id * BS + offset, negative = skip. Returns the op's done flag.
    int8 caches: key_scale_cache, value_scale_cache [NB, BS, KVH] float32, written in place too."""
    backend = resolve_backend(_device(), backend)
    t, kvh, d = _shape("key", key, 3)
    _ascendc_operand(backend, "key", key, d)
    _same("value", value, "key", key)
    nb, bs = _cache_shape(key_cache, value_cache, kvh, d, key_scale_cache, value_scale_cache)
    _ascendc_caches(backend, key_cache, "key", key, d)
    slots = _ints("slot_mapping", slot_mapping, (t,))
    if slots.size and slots.max() >= nb * bs:
        raise ValueError(f"slot_mapping holds {slots.max()}, past the cache's {nb * bs} slots (NB {nb} x BS {bs})")
    cell = _reshape_and_cache_cell(_device(), backend, key_cache.dtype == ms.int8)
    if cell.quantized:
        return cell(key, value, key_cache, value_cache, slot_mapping, key_scale_cache, value_scale_cache)
    return cell(key, value, key_cache, value_cache, slot_mapping)


def paged_attention(query, key_cache, value_cache, block_tables, context_lens, query_start_loc, scale,
                    key_scale_cache=None, value_scale_cache=None, backend=None):
    """query [T, H, D] -> [T, H, D]; sequence b owns query rows query_start_loc[b]:query_start_loc[b+1],
    the last tokens of its context_lens[b] tokens; causal; GQA when H > KVH. Rows owned by no sequence
    come out zero. int8 caches: key_scale_cache, value_scale_cache [NB, BS, KVH] float32."""
    backend = resolve_backend(_device(), backend)
    t, h, d = _shape("query", query, 3)
    _ascendc_operand(backend, "query", query, d)
    kvh = _shape("key_cache", key_cache, 4, cache=True)[2]
    if h % kvh:
        raise ValueError(f"query's {h} heads must be a multiple of the caches' {kvh} KV heads")
    nb, bs = _cache_shape(key_cache, value_cache, kvh, d, key_scale_cache, value_scale_cache)
    _ascendc_caches(backend, key_cache, "query", query, d)
    tables = _ints("block_tables", block_tables, None, ndim=2)
    b, max_blocks = tables.shape
    lens = _ints("context_lens", context_lens, (b,))
    starts = _ints("query_start_loc", query_start_loc, (b + 1,))
    if starts[0] < 0 or np.any(np.diff(starts) < 0) or starts[-1] > t:
        raise ValueError(f"query_start_loc must rise from >= 0 to at most T = {t}, got {starts.tolist()}")
    for i in np.flatnonzero(np.diff(starts)):
        n, ctx = int(starts[i + 1] - starts[i]), int(lens[i])
        if ctx < n:
            raise ValueError(f"sequence {i}: context_lens {ctx} is shorter than its {n} queries")
        need = -(-ctx // bs)
        if need > max_blocks:
            raise ValueError(f"sequence {i}: {ctx} tokens need {need} blocks, block_tables has {max_blocks}")
        used = tables[i, :need]
        if used.min() < 0 or used.max() >= nb:
            raise ValueError(f"sequence {i}: block_tables names block {used.min() if used.min() < 0 else used.max()}"
                             f", outside the cache's {nb} blocks")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    cell = _paged_attention_cell(h, kvh, d, float(scale), _device(), backend, key_cache.dtype == ms.int8)
    if cell.quantized:
        return cell(query, key_cache, value_cache, block_tables, context_lens, query_start_loc, key_scale_cache,
                    value_scale_cache)
    return cell(query, key_cache, value_cache, block_tables, context_lens, query_start_loc)


_TILING_KEYWORDS = {
    "paged_attention": ("num_tokens", "num_heads", "num_kv_heads", "head_dim", "block_size", "num_seqs",
                        "max_context", "dtype"),
    "reshape_and_cache": ("num_tokens", "num_kv_heads", "head_dim", "dtype"),
}
_CACHE_BYTES = {"float16": 2, "bfloat16": 2, "int8": 1}


def ascendc_tiling(op: str, **shape) -> dict:
    """The plan op_host's tiling computes for the AscendC kernel of op ("paged_attention" or
    "reshape_and_cache") on a call of this shape, for the assumed Atlas 800I A2 figures (the compiled C++
    of ops/ascendc/op_host/ms_atb_plan.h). Keywords, all required: paged_attention: num_tokens, num_heads,
    num_kv_heads, head_dim, block_size, num_seqs, max_context, dtype ("float16" or "bfloat16");
    reshape_and_cache: num_tokens, num_kv_heads, head_dim, dtype; optional for both: cache_dtype ("float16",
    "bfloat16" or "int8"; default dtype). Returns a dict with block_dim (cores used), cores (the AI cores when
    the launch uses the Cube unit, else the vector cores), ub_bytes (unified-buffer bytes one core asks for)
    and ub_capacity, the tile sizes and buffers of the op, and for paged_attention: cube (1: prefill chunks
    multiply on the Cube unit), rows_pad and l1_bytes / l0a_bytes / l0b_bytes / l0c_bytes (with their
    capacities), kv_splits (cores one work item's context is split over; their parts are merged after a
    SyncAll), base_items (an upper bound on the work items before the split) and workspace_bytes."""
    from ms_atb.ops import ascendc_build
    if op not in _TILING_KEYWORDS:
        raise ValueError(f"op must be one of {list(_TILING_KEYWORDS)}, got {op!r}")
    names = _TILING_KEYWORDS[op]
    given = set(shape) - {"cache_dtype"}
    if given != set(names):
        raise ValueError(f"ascendc_tiling({op!r}) takes the keywords {list(names)} (and cache_dtype); missing "
                         f"{sorted(set(names) - given)}, unknown {sorted(given - set(names))}")
    if shape["dtype"] not in ("float16", "bfloat16"):
        raise ValueError(f"dtype must be 'float16' or 'bfloat16', got {shape['dtype']!r}")
    cache_dtype = shape.get("cache_dtype", shape["dtype"])
    if cache_dtype not in (shape["dtype"], "int8"):
        raise ValueError(f"cache_dtype must be dtype ({shape['dtype']!r}) or 'int8', got {cache_dtype!r}")
    for name in names[:-1]:
        value = shape[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    s = shape
    if op == "paged_attention":
        if s["num_heads"] % s["num_kv_heads"]:
            raise ValueError(f"num_heads {s['num_heads']} must be a multiple of num_kv_heads {s['num_kv_heads']}")
        max_blocks = -(-s["max_context"] // s["block_size"])
        args = (s["num_tokens"], s["num_heads"], s["num_kv_heads"], s["head_dim"], s["block_size"], max_blocks,
                s["num_seqs"], max_blocks, 2, _CACHE_BYTES[cache_dtype])
    else:
        args = (s["num_tokens"], s["num_kv_heads"], s["head_dim"], 1, 1, 2, _CACHE_BYTES[cache_dtype])
    plan, why = ascendc_build.plan(op, args)
    if why:
        raise ValueError(f"ascendc_tiling({op!r}): no tiling for {shape}: {why}")
    return plan


@functools.lru_cache(maxsize=None)
def _reshape_and_cache_cell(device: str, backend: str, quantized: bool) -> ReshapeAndCache:
    return ReshapeAndCache(device=device, backend=backend, quantized=quantized)


@functools.lru_cache(maxsize=64)
def _paged_attention_cell(h: int, kvh: int, d: int, scale: float, device: str, backend: str,
                          quantized: bool) -> PagedAttention:
    return PagedAttention(h, kvh, d, scale, device=device, backend=backend, quantized=quantized)


def _device() -> str:
    return "npu" if ms.get_context("device_target") == "Ascend" else "cpu"


def _ascendc_operand(backend: str, name: str, x, head_dim: int) -> None:
    if backend != "ascendc":
        return
    if x.dtype not in (ms.float16, ms.bfloat16):
        raise ValueError(f"backend 'ascendc' takes float16 or bfloat16 tensors, {name} is {x.dtype}")
    if head_dim % 16:
        raise ValueError(f"backend 'ascendc' copies whole 32-byte blocks: head_dim must be a multiple of 16, "
                         f"got {head_dim}")


def _ascendc_caches(backend: str, cache, name: str, x, head_dim: int) -> None:
    if backend != "ascendc":
        return
    if cache.dtype not in (x.dtype, ms.int8):
        raise ValueError(f"backend 'ascendc' takes caches of {name}'s dtype {x.dtype} or int8, got {cache.dtype}")
    if cache.dtype == ms.int8 and head_dim % 32:
        raise ValueError(f"backend 'ascendc' copies whole 32-byte int8 rows: head_dim must be a multiple of 32 with "
                         f"an int8 cache, got {head_dim}")


def _shape(name: str, x, ndim: int, cache: bool = False) -> tuple:
    if not isinstance(x, ms.Tensor):
        raise ValueError(f"{name} must be a mindspore Tensor, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    allowed = (ms.float32, ms.float16, ms.bfloat16) + ((ms.int8,) if cache else ())
    if x.dtype not in allowed:
        raise ValueError(f"{name} must be float32, float16{', bfloat16 or int8' if cache else ' or bfloat16'}, "
                         f"got {x.dtype}")
    return tuple(x.shape)


def _same(name: str, x, like_name: str, like, cache: bool = False) -> None:
    if _shape(name, x, like.ndim, cache) != tuple(like.shape) or x.dtype != like.dtype:
        raise ValueError(f"{name} {tuple(x.shape)} {x.dtype} must match {like_name} {tuple(like.shape)} {like.dtype}")


def _cache_shape(key_cache, value_cache, kvh: int, d: int, key_scales, value_scales) -> tuple[int, int]:
    nb, bs, cache_kvh, cache_d = _shape("key_cache", key_cache, 4, cache=True)
    _same("value_cache", value_cache, "key_cache", key_cache, cache=True)
    if (cache_kvh, cache_d) != (kvh, d):
        raise ValueError(f"the caches hold {cache_kvh} KV heads of {cache_d}, the tokens {kvh} of {d}")
    if key_cache.dtype != ms.int8:
        if key_scales is not None or value_scales is not None:
            raise ValueError(f"key_scale_cache and value_scale_cache go with int8 caches, not {key_cache.dtype}")
        return nb, bs
    for name, x in (("key_scale_cache", key_scales), ("value_scale_cache", value_scales)):
        if not isinstance(x, ms.Tensor) or x.dtype != ms.float32 or tuple(x.shape) != (nb, bs, kvh):
            got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, ms.Tensor) else type(x).__name__
            raise ValueError(f"int8 caches need {name}, a float32 Tensor [NB, BS, KVH] = {(nb, bs, kvh)}, got {got}")
    return nb, bs


def _ints(name: str, x, shape: tuple | None, ndim: int = 1) -> np.ndarray:
    if not isinstance(x, ms.Tensor) or x.dtype != ms.int32:
        raise ValueError(f"{name} must be an int32 mindspore Tensor, got "
                         f"{x.dtype if isinstance(x, ms.Tensor) else type(x).__name__}")
    if x.ndim != ndim or (shape is not None and tuple(x.shape) != shape):
        raise ValueError(f"{name} must have shape {shape or f'{ndim} dimensions'}, got {tuple(x.shape)}")
    return x.asnumpy()
