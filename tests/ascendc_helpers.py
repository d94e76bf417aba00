"""Calling the AscendC kernels' aot entry points on numpy arrays (ctypes, no MindSpore), with bfloat16
held as uint16 bits, and the batches of the AscendC kernel tests."""
import ctypes

import numpy as np

from ms_atb.ops import ascendc_build


def to_bf16_bits(x) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounded to nearest even as the hardware's Cast does."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(bits) -> np.ndarray:
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def storage(x, dtype: str) -> np.ndarray:
    """x in the kernel's storage: float16 array, or bfloat16 bits."""
    return np.asarray(x, np.float16) if dtype == "float16" else to_bf16_bits(x)


def values(x, dtype: str) -> np.ndarray:
    """The float32 values a storage array holds."""
    return x.astype(np.float32) if dtype == "float16" else from_bf16_bits(x)


def call(name: str, arrays: list, dtypes: list) -> int:
    """Kernel `name` of the AscendC library through the aot ABI; arrays' dtypes named by `dtypes`."""
    fn = getattr(ctypes.CDLL(ascendc_build.ascendc_library()), name)
    n = len(arrays)
    params = (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays])
    ndims = (ctypes.c_int * n)(*[a.ndim for a in arrays])
    shapes = (ctypes.POINTER(ctypes.c_int64) * n)(*[(ctypes.c_int64 * max(a.ndim, 1))(*a.shape) for a in arrays])
    names = (ctypes.c_char_p * n)(*[d.encode() for d in dtypes])
    return fn(n, params, ndims, shapes, names, None, None)


def paged_attention(query, key_cache, value_cache, tables, lens, qsl, scale, dtype):
    out = np.full(query.shape, 0x7E00 if dtype == "float16" else 0x7FC0, np.uint16).view(query.dtype)  # NaN
    status = call("MsAtbPagedAttention",
                  [query, key_cache, value_cache, tables, lens, qsl, np.array([scale], np.float32), out],
                  [dtype] * 3 + ["int32"] * 3 + ["float32", dtype])
    return status, out


def make_batch(rng, seqs, h, kvh, d, bs, nb, layout, pad_rows=0):
    """seqs: (context_len, num_queries) per sequence ((0, 0): a padded sequence) -> query float32 [T, H, D],
    block_tables, context_lens, query_start_loc; scattered layouts draw block ids in random order."""
    need = [-(-c // bs) for c, _ in seqs]
    tables = np.full((len(seqs), max(need) + 1), -1, np.int32)
    ids = np.arange(nb) if layout == "contiguous" else rng.permutation(nb)
    pos = 0
    for b, n in enumerate(need):
        tables[b, :n] = ids[pos:pos + n]
        pos += n
    assert pos <= nb, "the cache is too small for the batch"
    qsl = np.concatenate([[0], np.cumsum([q for _, q in seqs])]).astype(np.int32)
    query = rng.standard_normal((int(qsl[-1]) + pad_rows, h, d)).astype(np.float32)
    return query, tables, np.array([c for c, _ in seqs], np.int32), qsl
