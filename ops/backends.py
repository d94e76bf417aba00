"""The attention backends as the ops resolve them (which backends run on which device is
ms_atb/attention_backends.py's table), and the AscendC custom ops installed for Ascend.
"""
import glob
import os

from ms_atb.attention_backends import ATTENTION_BACKENDS, DEVICE_BACKENDS

BUILD_COMMAND = "ASCEND_HOME_PATH=<CANN path> bash scripts/build_ascend_ops.sh"


def resolve_backend(device: str, backend) -> str:
    """The concrete backend for device "cpu" or "npu"; ValueError for an unknown or misplaced one."""
    if device not in DEVICE_BACKENDS:
        raise ValueError(f"device must be 'cpu' or 'npu', got {device!r}")
    if backend is None or backend == "auto":
        return DEVICE_BACKENDS[device][0]
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {list(ATTENTION_BACKENDS)}, got {backend!r}")
    if backend not in DEVICE_BACKENDS[device]:
        raise ValueError(f"attention_backend {backend!r} does not run on device {device!r}; allowed there: "
                         f"{['auto', *DEVICE_BACKENDS[device]]}")
    return backend


def custom_op_package(op_name: str) -> str | None:
    """The installed CANN custom-op vendor directory that declares op_name, or None. Searched: every
    directory of ASCEND_CUSTOM_OPP_PATH, then $ASCEND_OPP_PATH/vendors/*."""
    roots = [p for p in os.environ.get("ASCEND_CUSTOM_OPP_PATH", "").split(":") if p]
    if os.environ.get("ASCEND_OPP_PATH"):
        roots += sorted(glob.glob(os.path.join(os.environ["ASCEND_OPP_PATH"], "vendors", "*")))
    for root in roots:
        for info in glob.glob(os.path.join(root, "op_impl", "ai_core", "tbe", "config", "*", "aic-*-ops-info.json")):
            try:
                with open(info, encoding="utf-8") as f:
                    if f'"{op_name}"' in f.read():
                        return root
            except OSError:
                continue
    return None


def ascend_custom_op(op_name: str, input_names: tuple, out_shape, out_dtype):
    """ops.Custom launching the installed AscendC custom op op_name on Ascend; a ValueError naming the
    build command when no installed package declares it."""
    if custom_op_package(op_name) is None:
        raise ValueError(f"attention_backend 'ms_atb' needs the custom op {op_name}, which no installed package "
                         f"declares (searched ASCEND_CUSTOM_OPP_PATH={os.environ.get('ASCEND_CUSTOM_OPP_PATH', '')!r} "
                         f"and $ASCEND_OPP_PATH/vendors): build and install it with `{BUILD_COMMAND}`, export the "
                         f"ASCEND_CUSTOM_OPP_PATH it prints, or choose attention_backend 'mindspore'")
    from mindspore import ops
    from mindspore.ops import CustomRegOp, DataType

    reg = CustomRegOp(op_name)
    for i, name in enumerate(input_names):
        reg = reg.input(i, name)
    reg = reg.output(0, "out").dtype_format(*([DataType.None_None] * (len(input_names) + 1)))
    return ops.Custom(op_name, out_shape=out_shape, out_dtype=out_dtype, func_type="aot",
                      reg_info=reg.target("Ascend").get_op_info())
