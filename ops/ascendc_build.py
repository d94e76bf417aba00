"""Builds the AscendC kernels of ops/ascendc/op_kernel for the CPU, against our implementation of the
Ascend C API subset (ops/ascendc/cpu_sim), into one shared library cached beside the C++ kernels.

The cache key hashes every source of ops/ascendc, the compiler, the flags and the CPU, as build.py
does for the C++ kernels; the build itself is build.compile_library (temporary file, then rename). The
cache is trusted and the library loaded as the C++ kernels' are (build.checked_library, build.load_checked,
ops/trusted_cache.py).
"""
import ctypes
import functools
from pathlib import Path

from ms_atb.ops import build

ASCENDC_DIR = build.SOURCE_DIR / "ascendc"
SIM_DIR = ASCENDC_DIR / "cpu_sim"
HOST_DIR = ASCENDC_DIR / "op_host"
KERNEL_DIR = ASCENDC_DIR / "op_kernel"
SOURCES = (SIM_DIR / "aot_entry.cc", SIM_DIR / "sim_runner.cc", KERNEL_DIR / "ms_atb_paged_attention.cpp",
           KERNEL_DIR / "ms_atb_reshape_and_cache.cpp")
# The kernels read their tiling structs as CANN generates them for op_kernel: from the op_host headers.
INCLUDE_FLAGS = ("-I", str(SIM_DIR), "-I", str(HOST_DIR), "-I", str(KERNEL_DIR), "-include", "kernel_tiling.h")

# Fields of the plans, in the order MsAtbPlanPagedAttention / MsAtbPlanReshapeAndCache write them.
PAGED_ATTENTION_PLAN = ("block_dim", "ub_bytes", "q_tile", "head_tile", "span", "q_bytes", "kv_bytes", "out_bytes",
                        "rows_f32_bytes", "kv_f32_bytes", "scores_bytes", "stats_bytes", "work_bytes", "p_bytes",
                        "stage_bytes", "cube", "rows_pad", "l1_bytes", "l0a_bytes", "l0b_bytes", "l0c_bytes",
                        "kv_splits", "base_items", "ws_core_bytes", "partial_bytes", "workspace_bytes", "cores",
                        "vector_cores", "cube_cores", "ub_capacity", "l1_capacity", "l0a_capacity", "l0b_capacity",
                        "l0c_capacity")
RESHAPE_AND_CACHE_PLAN = ("block_dim", "ub_bytes", "chunk_elems", "chunk_bytes", "vector_cores", "ub_capacity")


def source_files() -> list:
    return sorted(p for p in ASCENDC_DIR.rglob("*") if p.suffix in (".h", ".cc", ".cpp"))


def cache_key(compiler: str) -> str:
    files = [(str(path.relative_to(ASCENDC_DIR)), path) for path in source_files()]
    return build.files_key(files + [(build.EXPORTS, build.SOURCE_DIR / build.EXPORTS)], compiler)


@functools.lru_cache(maxsize=None)
def ascendc_library() -> str:
    """Path of the compiled AscendC library in the cache (its file name contains `ascendc`), building it on first
    use."""
    return str(build.checked_library(_stem(), _compile)[0])


@functools.lru_cache(maxsize=None)
def loaded_ascendc_library() -> str:
    """Path of the AscendC library as this process loads it (build.load_checked); the path to give ctypes.CDLL
    and ops.Custom."""
    return build.load_checked(*build.checked_library(_stem(), _compile))


def _stem() -> str:
    return f"ms_atb_ascendc_{cache_key(build.find_compiler())}"


def _compile(target) -> None:
    build.compile_library(target, INCLUDE_FLAGS, tuple(str(s) for s in SOURCES))


@functools.lru_cache(maxsize=None)
def _handle():
    lib = ctypes.CDLL(loaded_ascendc_library())
    for name in ("MsAtbPlanPagedAttention", "MsAtbPlanReshapeAndCache"):
        fn = getattr(lib, name)
        fn.argtypes = (ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
                       ctypes.POINTER(ctypes.c_char_p))
        fn.restype = ctypes.c_int
    lib.MsAtbAscendcLastError.restype = ctypes.c_char_p
    return lib


def plan(op: str, shape: tuple) -> tuple[dict, str]:
    """The op_host tiling of op ("paged_attention" or "reshape_and_cache") for shape (see aot_entry.cc),
    computed by the compiled C++ itself; and why it failed ("" when it did not)."""
    fn, fields = ((_handle().MsAtbPlanPagedAttention, PAGED_ATTENTION_PLAN) if op == "paged_attention"
                  else (_handle().MsAtbPlanReshapeAndCache, RESHAPE_AND_CACHE_PLAN))
    out = (ctypes.c_int64 * len(fields))()
    why = ctypes.c_char_p()
    status = fn((ctypes.c_int64 * len(shape))(*shape), out, ctypes.byref(why))
    return dict(zip(fields, out)), (why.value or b"").decode() if status else ""


def last_error() -> str:
    """The message of the last rule a kernel broke in this process (empty if none)."""
    return _handle().MsAtbAscendcLastError().decode()


def aot_op(func_name: str, input_names: tuple, out_dtype):
    """A mindspore.ops.Custom aot op on the CPU for AscendC kernel entry `func_name` of the library."""
    from mindspore import ops
    from mindspore.ops import CustomRegOp, DataType

    reg = CustomRegOp(func_name)
    for i, name in enumerate(input_names):
        reg = reg.input(i, name)
    reg = reg.output(0, "out").dtype_format(*([DataType.None_None] * (len(input_names) + 1)))
    return ops.Custom(f"{loaded_ascendc_library()}:{func_name}", out_shape=None, out_dtype=out_dtype, func_type="aot",
                      reg_info=reg.target("CPU").get_op_info())
