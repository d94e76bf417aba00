"""The attention backends: which kernels run the two KV-cache ops (reshape_and_cache, paged_attention) on each
device. Declared here once and read by the config's validation (ms_atb/config.py), the ops' resolution
(ops/backends.py) and, through the ops, the model runner. It imports nothing, so that MindSpore-free code
(the config) and the kernels (ops/, which may not import the front door's modules) can both read it.

    cpu       our C++ kernels (ops/*.cc), on the CPU
    ascendc   our AscendC kernels (ops/ascendc/op_kernel) on the CPU, through our implementation of the
              Ascend C API subset; float16 and bfloat16, caches of the same type or int8
    ms_atb    our AscendC kernels on Ascend, as the custom ops MsAtbPagedAttention / MsAtbReshapeAndCache
              of the package scripts/build_ascend_ops.sh builds and installs
    mindspore MindSpore's built-in PagedAttention / ReshapeAndCache, on Ascend
    auto      the device's first: cpu on the CPU, ms_atb on Ascend
"""

# device kind ("npu" or "cpu", as parse_device returns it) -> the backends that run there, "auto"'s choice first
DEVICE_BACKENDS = {"npu": ("ms_atb", "mindspore"), "cpu": ("cpu", "ascendc")}
ATTENTION_BACKENDS = ("auto",) + tuple(b for backends in DEVICE_BACKENDS.values() for b in backends)
