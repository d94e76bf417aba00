"""ReshapeAndCache: write this step's K/V rows into the paged cache, in place."""
import mindspore as ms
from mindspore import nn

from ms_atb.ops import build
from ms_atb.ops.backends import ascend_custom_op, resolve_backend

_INPUTS = ("key", "value", "key_cache", "value_cache", "slot_mapping")


class ReshapeAndCache(nn.Cell):
    """rc(key [T, KVH, D], value [T, KVH, D], key_cache [NB, BS, KVH, D] Parameter, value_cache,
    slot_mapping [T] int32) -> done [1] int32.

    Row t goes to slot slot_mapping[t] = block * BS + offset; a negative slot is skipped (padding).
    The caches are updated in place. Make every read of the caches depend on the returned value
    (`ops.depend(query, done)`) so the graph orders it after the write. backend: as PagedAttention's; with
    "cpu" the rows are converted to the caches' dtype (float32, float16, bfloat16) as they are written.

    quantized=True ("cpu" or "ascendc" backend): int8 caches; construct also takes key_scale_cache and
    value_scale_cache [NB, BS, KVH] float32 Parameters, and each (token, KV head) row is stored as
    round(x * 127 / max|x|) with the scale max|x| / 127 in the same slot of the scale cache
    (docs/design.md, "int8 KV cache").
    """

    def __init__(self, device: str = "cpu", backend: str | None = None, quantized: bool = False):
        super().__init__()
        self.backend = resolve_backend(device, backend)
        if quantized and self.backend not in ("cpu", "ascendc"):
            raise ValueError(f"an int8 KV cache runs with attention_backend 'cpu' or 'ascendc', got {self.backend!r}")
        self.device, self.quantized = device, quantized
        if quantized and self.backend == "ascendc":
            from ms_atb.ops import ascendc_build
            self.op = ascendc_build.aot_op("MsAtbReshapeAndCacheQuant",
                                           _INPUTS + ("key_scale_cache", "value_scale_cache"), ms.int32)
        elif quantized:
            self.op = build.aot_op("ReshapeAndCacheQuant", _INPUTS + ("key_scale_cache", "value_scale_cache"),
                                   ms.int32)
        elif self.backend == "cpu":
            self.op = build.aot_op("ReshapeAndCache", _INPUTS, ms.int32)
        elif self.backend == "ascendc":
            from ms_atb.ops import ascendc_build
            self.op = ascendc_build.aot_op("MsAtbReshapeAndCache", _INPUTS, ms.int32)
        elif self.backend == "ms_atb":
            # UNVERIFIED (no Ascend here): our AscendC kernel, installed as a CANN custom op.
            self.op = ascend_custom_op("MsAtbReshapeAndCache", _INPUTS, lambda *_: [1], lambda *_: ms.int32)
        else:
            # UNVERIFIED (no Ascend here): MindSpore's ATB-backed op, same arguments and layout.
            from mindspore.ops.auto_generate import ReshapeAndCache as AscendReshapeAndCache
            self.op = AscendReshapeAndCache()
        if self.backend != "mindspore":
            self.op.add_prim_attr("side_effect_mem", True)

    def construct(self, key, value, key_cache, value_cache, slot_mapping, key_scale_cache=None,
                  value_scale_cache=None):
        if self.quantized:
            return self.op(key, value, key_cache, value_cache, slot_mapping, key_scale_cache, value_scale_cache)
        return self.op(key, value, key_cache, value_cache, slot_mapping)


class RopeAndCache(nn.Cell):
    """rc(qkv [T, (H + 2 KVH) D] float32, cos [T, D], sin [T, D], perm [D] int32, key_cache [NB, BS, KVH, D]
    Parameter, value_cache, slot_mapping [T] int32) -> q [T, H D] float32, on the CPU ("cpu" backend).

    An attention's rotary embedding (RotaryEmbedding's formula on q's and k's heads), its q/k/v split and
    ReshapeAndCache's write of k and v, in one op; H comes from qkv's width and the caches' KVH and D. The
    caches may be float32, float16, bfloat16, or int8 with quantized=True (then construct also takes
    key_scale_cache and value_scale_cache, as ReshapeAndCache). Every read of the caches must consume the
    returned q (or depend on it), which orders it after the write.
    """

    def __init__(self, quantized: bool = False):
        super().__init__()
        self.quantized = quantized
        names = ("qkv", "cos", "sin", "perm") + _INPUTS[2:]
        if quantized:
            self.op = build.aot_op("RopeAndCacheQuant", names + ("key_scale_cache", "value_scale_cache"), ms.float32)
        else:
            self.op = build.aot_op("RopeAndCache", names, ms.float32)
        self.op.add_prim_attr("side_effect_mem", True)

    def construct(self, qkv, cos, sin, perm, key_cache, value_cache, slot_mapping, key_scale_cache=None,
                  value_scale_cache=None):
        if self.quantized:
            return self.op(qkv, cos, sin, perm, key_cache, value_cache, slot_mapping, key_scale_cache,
                           value_scale_cache)
        return self.op(qkv, cos, sin, perm, key_cache, value_cache, slot_mapping)
