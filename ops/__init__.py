"""Kernels and their registration through mindspore.ops.Custom.

`reshape_and_cache` and `paged_attention` are the functional forms of docs/design.md (argument checks, then a Cell).
`ReshapeAndCache`, `RopeAndCache`, `PagedAttention`, `CachedAttention`, `DecoderLayer`, `LoraAdd`, `PackedMatMul`, `QuantMatMul` and the elementwise ops are Cells
usable inside graph-mode Cells, on the CPU through C++ aot kernels (compiled on first use, see build.py) or our AscendC kernels run by a CPU
implementation of the Ascend C API subset (ascendc_build.py), and on Ascend through our AscendC custom
ops or MindSpore's built-in ops (backends.py; unverified; PackedMatMul, QuantMatMul and the elementwise kernels are CPU-only: on Ascend
the model uses MindSpore's MatMul and the same formulas in MindSpore ops).
"""
from ms_atb.ops.cached_attention import CachedAttention
from ms_atb.ops.decoder_layer import DecoderLayer
from ms_atb.ops.elementwise import AddRmsNorm, LastTokenNorm, RmsNorm, RotaryEmbedding, SwiGlu
from ms_atb.ops.lora import LoraAdd
from ms_atb.ops.matmul import PackedMatMul, pack_weight, packed_shape, unpack_weight
from ms_atb.ops.paged_attention import PagedAttention
from ms_atb.ops.quant_matmul import QuantMatMul
from ms_atb.ops.reshape_and_cache import ReshapeAndCache, RopeAndCache
# The functional forms of docs/design.md. They take the names of their submodules as package attributes:
# `from ms_atb.ops.paged_attention import PagedAttention` still reads the submodule.
from ms_atb.ops.functional import ascendc_tiling, paged_attention, reshape_and_cache  # noqa: E402

__all__ = ["AddRmsNorm", "CachedAttention", "DecoderLayer", "LastTokenNorm", "LoraAdd", "PackedMatMul", "QuantMatMul", "ascendc_tiling", "PagedAttention", "ReshapeAndCache",
           "RmsNorm", "RopeAndCache", "RotaryEmbedding", "SwiGlu", "pack_weight", "packed_shape", "paged_attention", "reshape_and_cache", "unpack_weight"]
