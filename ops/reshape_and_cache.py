"""ReshapeAndCache: write this step's K/V rows into the paged cache, in place."""
import mindspore as ms
from mindspore import nn

from ms_atb.ops import build


class ReshapeAndCache(nn.Cell):
    """rc(key [T, KVH, D], value [T, KVH, D], key_cache [NB, BS, KVH, D] Parameter, value_cache,
    slot_mapping [T] int32) -> done [1] int32.

    Row t goes to slot slot_mapping[t] = block * BS + offset; a negative slot is skipped (padding).
    The caches are updated in place. Make every read of the caches depend on the returned value
    (`ops.depend(query, done)`) so the graph orders it after the write.
    """

    def __init__(self, device: str = "cpu"):
        super().__init__()
        if device not in ("cpu", "npu"):
            raise ValueError(f"device must be 'cpu' or 'npu', got {device!r}")
        self.device = device
        if device == "cpu":
            self.op = build.aot_op("ReshapeAndCache",
                                   ("key", "value", "key_cache", "value_cache", "slot_mapping"), ms.int32)
            self.op.add_prim_attr("side_effect_mem", True)
        else:
            # UNVERIFIED (no Ascend here): MindSpore's ATB-backed op, same arguments and layout.
            from mindspore.ops.auto_generate import ReshapeAndCache as AscendReshapeAndCache
            self.op = AscendReshapeAndCache()

    def construct(self, key, value, key_cache, value_cache, slot_mapping):
        return self.op(key, value, key_cache, value_cache, slot_mapping)
