"""KVPool: the model's KV cache Parameters backed by numpy arrays this process owns, so that whole blocks can
be copied out of the pool and into it between steps (the disk tier's transfers, ms_atb/worker/disk_tier.py).

Each cache Parameter is given the memory of a zeroed numpy array (`Tensor.from_numpy` shares it, and the
graph's cache writes land in it in place; checked when the pool is made). Zeroed arrays of this size are
pages the OS maps on first write, as the Parameters' own initializers are (docs/design.md, Start-up).

A block's bytes, as the tier keeps them: for each layer, the block's K rows then V rows in the caches' layout
[BS, KVH, D], then for an int8 cache its K and V scales [BS, KVH] float32. block_bytes is
kv_cache_bytes_per_block's figure for one rank.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np


def _numpy_dtype(dtype) -> np.dtype:
    """The numpy dtype MindSpore gives a tensor of `dtype` (bfloat16 included)."""
    return ms.Tensor(np.zeros(1, np.float32)).astype(dtype).asnumpy().dtype


class KVPool:
    def __init__(self, model):
        """model: a LlamaForCausalLM whose caches no graph has run on yet."""
        arrays = []
        for i in range(len(model.key_caches)):
            caches = [model.key_caches[i], model.value_caches[i]]
            if model.key_scale_caches is not None:
                caches += [model.key_scale_caches[i], model.value_scale_caches[i]]
            for param in caches:
                array = np.zeros(param.shape, _numpy_dtype(param.dtype))
                param.set_data(ms.Tensor.from_numpy(array))
                arrays.append(array)
        assert np.shares_memory(model.key_caches[0].asnumpy(), arrays[0]), "the cache Parameter copied its array"
        self.num_blocks = arrays[0].shape[0]
        # per part (layer-major: K, V[, K scales, V scales]): its blocks' bytes [NB, part bytes] and offset
        self._rows = [a.reshape(self.num_blocks, -1).view(np.uint8) for a in arrays]
        self._offsets = np.cumsum([0] + [r.shape[1] for r in self._rows]).tolist()
        self.block_bytes = self._offsets[-1]

    def read(self, blocks: list[int]) -> np.ndarray:
        """Copies of blocks' bytes, uint8 [len(blocks), block_bytes] (each row contiguous)."""
        ids = np.asarray(blocks, np.int64)
        out = np.empty((len(ids), self.block_bytes), np.uint8)
        for rows, lo, hi in zip(self._rows, self._offsets, self._offsets[1:]):
            out[:, lo:hi] = rows[ids]
        return out

    def write(self, block: int, data: np.ndarray) -> None:
        """Copies data (uint8 [block_bytes]) into the pool's block `block`."""
        assert data.shape == (self.block_bytes,), (data.shape, self.block_bytes)
        for rows, lo, hi in zip(self._rows, self._offsets, self._offsets[1:]):
            rows[block] = data[lo:hi]
