"""CachedAttention: a decoder layer's attention on the CPU as one op (rotary embedding, cache write, attention)."""
import mindspore as ms
from mindspore import Tensor, nn

from ms_atb.ops import build

_INPUTS = ("qkv", "cos", "sin", "perm", "key_cache", "value_cache", "slot_mapping", "block_tables", "context_lens",
           "query_start_loc", "scale")


class CachedAttention(nn.Cell):
    """attn(qkv [T, (H + 2 KVH) D] float32, cos [T, D], sin [T, D], perm [D] int32, key_cache [NB, BS, KVH, D]
    Parameter, value_cache, slot_mapping [T] int32, block_tables [B, MAXB] int32, context_lens [B] int32,
    query_start_loc [B + 1] int32) -> [T, H D] float32, with our CPU kernels ("cpu" attention backend).

    RopeAndCache then PagedAttention (their formulas, rules and cache dtypes) in one op: q and k rotated, k and
    v written to their slots (negative: skipped), then q attends over the caches. H comes from qkv's width and
    the caches' KVH and D. quantized=True: int8 caches; construct also takes key_scale_cache and
    value_scale_cache [NB, BS, KVH] float32 Parameters.
    """

    def __init__(self, scale: float, quantized: bool = False):
        super().__init__()
        self.quantized = quantized
        self.scale_t = Tensor([scale], ms.float32)  # [1]
        if quantized:
            self.op = build.aot_op("CachedAttentionQuant", _INPUTS + ("key_scale_cache", "value_scale_cache"),
                                   ms.float32)
        else:
            self.op = build.aot_op("CachedAttention", _INPUTS, ms.float32)
        self.op.add_prim_attr("side_effect_mem", True)

    def construct(self, qkv, cos, sin, perm, key_cache, value_cache, slot_mapping, block_tables, context_lens,
                  query_start_loc, key_scale_cache=None, value_scale_cache=None):
        if self.quantized:
            return self.op(qkv, cos, sin, perm, key_cache, value_cache, slot_mapping, block_tables, context_lens,
                           query_start_loc, self.scale_t, key_scale_cache, value_scale_cache)
        return self.op(qkv, cos, sin, perm, key_cache, value_cache, slot_mapping, block_tables, context_lens,
                       query_start_loc, self.scale_t)
