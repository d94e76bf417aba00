"""ReshapeAndCache: write this step's K/V rows into the paged cache, in place."""
import mindspore as ms
from mindspore import nn

from ms_atb.ops import build


class ReshapeAndCache(nn.Cell):
    """rc(key [T, KVH, D], value [T, KVH, D], key_cache [NB, BS, KVH, D] Parameter, value_cache,
    slot_mapping [T] int32) -> done [1] int32.

    Row t goes to slot slot_mapping[t] = block * BS + offset; a negative slot is skipped (padding).
    The caches are updated in place. Make every read of the caches depend on the returned value
    (`ops.depend(query, done)`) so the graph orders it after the write. The rows are converted to the
    caches' dtype (float32, float16, bfloat16) as they are written.

    quantized=True: int8 caches; construct also takes key_scale_cache and value_scale_cache [NB, BS, KVH]
    float32 Parameters, and each (token, KV head) row is stored as round(x * 127 / max|x|) with the scale
    max|x| / 127 in the same slot of the scale cache (docs/design.md, "int8 KV cache").
    """

    def __init__(self, device: str = "cpu", quantized: bool = False):
        super().__init__()
        if device not in ("cpu", "npu"):
            raise ValueError(f"device must be 'cpu' or 'npu', got {device!r}")
        if quantized and device != "cpu":
            raise ValueError("an int8 KV cache runs on the CPU only (kv_cache.cache_dtype int8 with device 'cpu')")
        self.device, self.quantized = device, quantized
        if device == "cpu":
            names = ("key", "value", "key_cache", "value_cache", "slot_mapping")
            if quantized:
                self.op = build.aot_op("ReshapeAndCacheQuant", names + ("key_scale_cache", "value_scale_cache"),
                                       ms.int32)
            else:
                self.op = build.aot_op("ReshapeAndCache", names, ms.int32)
            self.op.add_prim_attr("side_effect_mem", True)
        else:
            # UNVERIFIED (no Ascend here): MindSpore's ATB-backed op, same arguments and layout.
            from mindspore.ops.auto_generate import ReshapeAndCache as AscendReshapeAndCache
            self.op = AscendReshapeAndCache()

    def construct(self, key, value, key_cache, value_cache, slot_mapping, key_scale_cache=None,
                  value_scale_cache=None):
        if self.quantized:
            return self.op(key, value, key_cache, value_cache, slot_mapping, key_scale_cache, value_scale_cache)
        return self.op(key, value, key_cache, value_cache, slot_mapping)
