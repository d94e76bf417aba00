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
    (`ops.depend(query, done)`) so the graph orders it after the write. backend: as PagedAttention's.
    """

    def __init__(self, device: str = "cpu", backend: str | None = None):
        super().__init__()
        self.backend = resolve_backend(device, backend)
        self.device = device
        if self.backend == "cpu":
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

    def construct(self, key, value, key_cache, value_cache, slot_mapping):
        return self.op(key, value, key_cache, value_cache, slot_mapping)
