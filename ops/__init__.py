"""Kernels and their registration through mindspore.ops.Custom.

`ReshapeAndCache` and `PagedAttention` are Cells usable inside graph-mode Cells, on the CPU
through C++ aot kernels (compiled on first use, see build.py) and on Ascend through
MindSpore's built-in ops (unverified).
"""
from ms_atb.ops.paged_attention import PagedAttention
from ms_atb.ops.reshape_and_cache import ReshapeAndCache

__all__ = ["PagedAttention", "ReshapeAndCache"]
