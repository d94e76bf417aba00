"""The functional forms of the two KV-cache ops (docs/design.md), for eager callers (scripts, tests, notebooks).

    reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)             # in place
    paged_attention(query, key_cache, value_cache, block_tables, context_lens, query_start_loc, scale)

The model's graphs use the Cells (ReshapeAndCache, PagedAttention) directly. These wrappers check every
argument on the host first, so a bad call is a ValueError naming the argument instead of a kernel error
code (which in graph mode would also leave that compiled graph unusable), then run a cached Cell.
"""
from __future__ import annotations

import functools
import math

import mindspore as ms
import numpy as np

from ms_atb.ops.paged_attention import PagedAttention
from ms_atb.ops.reshape_and_cache import ReshapeAndCache


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping):
    """key, value [T, KVH, D]; key_cache, value_cache [NB, BS, KVH, D] (whole tensors: written in place);
    slot_mapping [T] int32, slot = block_id * BS + offset, negative = skip. Returns the op's done flag."""
    t, kvh, d = _shape("key", key, 3)
    _same("value", value, "key", key)
    nb, bs = _cache_shape(key_cache, value_cache, kvh, d, key)
    slots = _ints("slot_mapping", slot_mapping, (t,))
    if slots.size and slots.max() >= nb * bs:
        raise ValueError(f"slot_mapping holds {slots.max()}, past the cache's {nb * bs} slots (NB {nb} x BS {bs})")
    return _reshape_and_cache_cell(_device())(key, value, key_cache, value_cache, slot_mapping)


def paged_attention(query, key_cache, value_cache, block_tables, context_lens, query_start_loc, scale):
    """query [T, H, D] -> [T, H, D]; sequence b owns query rows query_start_loc[b]:query_start_loc[b+1],
    the last tokens of its context_lens[b] tokens; causal; GQA when H > KVH. Rows owned by no sequence
    come out zero."""
    t, h, d = _shape("query", query, 3)
    kvh = _shape("key_cache", key_cache, 4)[2]
    if h % kvh:
        raise ValueError(f"query's {h} heads must be a multiple of the caches' {kvh} KV heads")
    nb, bs = _cache_shape(key_cache, value_cache, kvh, d, query)
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
    cell = _paged_attention_cell(h, kvh, d, float(scale), _device())
    return cell(query, key_cache, value_cache, block_tables, context_lens, query_start_loc)


@functools.lru_cache(maxsize=None)
def _reshape_and_cache_cell(device: str) -> ReshapeAndCache:
    return ReshapeAndCache(device=device)


@functools.lru_cache(maxsize=64)
def _paged_attention_cell(h: int, kvh: int, d: int, scale: float, device: str) -> PagedAttention:
    return PagedAttention(h, kvh, d, scale, device=device)


def _device() -> str:
    return "npu" if ms.get_context("device_target") == "Ascend" else "cpu"


def _shape(name: str, x, ndim: int) -> tuple:
    if not isinstance(x, ms.Tensor):
        raise ValueError(f"{name} must be a mindspore Tensor, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if x.dtype not in (ms.float32, ms.float16, ms.bfloat16):
        raise ValueError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")
    return tuple(x.shape)


def _same(name: str, x, like_name: str, like) -> None:
    if _shape(name, x, like.ndim) != tuple(like.shape) or x.dtype != like.dtype:
        raise ValueError(f"{name} {tuple(x.shape)} {x.dtype} must match {like_name} {tuple(like.shape)} {like.dtype}")


def _cache_shape(key_cache, value_cache, kvh: int, d: int, rows) -> tuple[int, int]:
    nb, bs, cache_kvh, cache_d = _shape("key_cache", key_cache, 4)
    _same("value_cache", value_cache, "key_cache", key_cache)
    if (cache_kvh, cache_d) != (kvh, d):
        raise ValueError(f"the caches hold {cache_kvh} KV heads of {cache_d}, the tokens {kvh} of {d}")
    if key_cache.dtype != rows.dtype:
        raise ValueError(f"the caches are {key_cache.dtype}, the tokens {rows.dtype}: they must match")
    return nb, bs


def _ints(name: str, x, shape: tuple | None, ndim: int = 1) -> np.ndarray:
    if not isinstance(x, ms.Tensor) or x.dtype != ms.int32:
        raise ValueError(f"{name} must be an int32 mindspore Tensor, got "
                         f"{x.dtype if isinstance(x, ms.Tensor) else type(x).__name__}")
    if x.ndim != ndim or (shape is not None and tuple(x.shape) != shape):
        raise ValueError(f"{name} must have shape {shape or f'{ndim} dimensions'}, got {tuple(x.shape)}")
    return x.asnumpy()
