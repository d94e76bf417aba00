"""Compiles the C++ kernels of ops/ into one shared library, cached on disk.

The cache is trusted as ops/trusted_cache.py says: its directory must be the user's own and closed
to others' writes, and the library is loaded only if its sha256 is the one recorded when it was built,
from a copy of the very bytes checked (`loaded/` in the cache: loaded_kernel_library).
The cache key hashes the sources, the compiler (path and version), the flags and the CPU
(-march=native code only runs where it was built). Compilation goes to a temporary file that
is renamed into place, so processes racing on one cache (msrun ranks) never see half a file.
"""
import functools
import hashlib
import os
import platform
import shutil
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from ms_atb.ops import trusted_cache
from ms_atb.ops.trusted_cache import private_dir, read_checked, read_file, record_digest, sweep_dead_temps

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = ("cached_attention.cc", "decoder_layer.cc", "elementwise.cc", "lora.cc", "matmul.cc", "paged_attention.cc",
           "quant_embedding.cc", "quant_matmul.cc", "quant_pack.cc", "reshape_and_cache.cc")
HEADERS = ("attention_decode.h", "attention_rows.h", "dtype.h", "fast_math.h", "gemm_tile.h", "kernel_profile.h",
           "paged_attention_spans.h", "paged_attention_tiled.h", "prefetch.h", "quant_dot.h", "quant_dot_sums.h",
           "quant_gemv.h", "quant_layout.h", "quant_rows.h", "rope_row.h", "thread_pool.h")
FLAGS = ("-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=0", "-fPIC", "-fno-semantic-interposition", "-shared", "-O3", "-march=native",
         "-fopenmp-simd", "-fno-trapping-math", "-pthread")
EXPORTS = "exports.map"      # the linker's version script: only the C entry points are exported
STALE_BUILD_S = 3600   # a temporary library this old belongs to a build that died
KERNEL_CACHE = "the kernel cache (MS_ATB_KERNEL_CACHE)"


def cache_dir() -> Path:
    return Path(os.environ.get("MS_ATB_KERNEL_CACHE") or Path.home() / ".cache" / "ms_atb" / "kernels")


def find_compiler() -> str:
    name = os.environ.get("CXX", "g++")
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(
            f"ms_atb.ops needs a C++17 compiler to build its CPU kernels, but {name!r} was not found on PATH: "
            "install g++ (Debian/Ubuntu: apt-get install g++) or set CXX to a compiler")
    return path


def cpu_signature() -> str:
    """The CPU model and feature flags, as far as the OS tells them."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                model = next((x for x in Path("/proc/cpuinfo").read_text().splitlines()
                              if x.startswith("model name")), "")
                return f"{platform.machine()}|{model}|{line}"
    except OSError:
        pass
    return f"{platform.machine()}|{platform.processor()}"


def cache_key(compiler: str) -> str:
    return files_key([(name, SOURCE_DIR / name) for name in SOURCES + HEADERS + (EXPORTS,)], compiler)


def files_key(files, compiler: str) -> str:
    """The cache key of a library built from files, (name, path) pairs, by compiler with FLAGS on this CPU."""
    h = hashlib.sha256()
    for name, path in files:
        h.update(name.encode() + b"\0" + Path(path).read_bytes() + b"\0")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    for part in (compiler, version, " ".join(FLAGS), cpu_signature()):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:24]


@functools.lru_cache(maxsize=None)
def kernel_library() -> str:
    """Path of the compiled kernel library in the cache, building it on first use."""
    return str(checked_library(f"ms_atb_kernels_{cache_key(find_compiler())}", compile_library)[0])


@functools.lru_cache(maxsize=None)
def loaded_kernel_library() -> str:
    """Path of the kernel library as this process loads it (checked, then loaded: trusted_cache.load_library);
    the path to give ctypes.CDLL and ops.Custom."""
    return load_checked(*checked_library(f"ms_atb_kernels_{cache_key(find_compiler())}", compile_library))


def checked_library(stem: str, build_it) -> tuple[Path, bytes]:
    """`<kernel cache>/<stem>.so` and its bytes, read once: the library built there whose sha256 is the one
    recorded; anything else there (a torn copy, a planted file) is replaced by build_it(path), a fresh build,
    atomically, so a rank sharing the cache that already holds the path still finds a complete library."""
    folder = private_dir(cache_dir(), KERNEL_CACHE)
    sweep_dead_temps(folder)
    target = folder / f"{stem}.so"
    data = read_checked(target)
    if data is None or not _complete_elf(data[:64], len(data)):
        build_it(target)
        data = read_file(target)
        record_digest(target, hashlib.sha256(data).hexdigest())
    return target, data


def load_checked(target: Path, data: bytes) -> str:
    """Loads `data`, the checked bytes of cached library `target`, from `loaded/<stem>.<sha256[:16]>.so` beside
    it; returns that path."""
    folder = private_dir(target.parent / "loaded", KERNEL_CACHE)
    return trusted_cache.load_library(data, folder / f"{target.stem}.{hashlib.sha256(data).hexdigest()[:16]}.so")


def is_complete_elf(path: Path) -> bool:
    """True when path is an ELF file holding everything its header says it has (the section header
    table sits at the end of the file, past every section). A cheap check that never loads the file."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return False
    return _complete_elf(head, size)


def _complete_elf(head: bytes, size: int) -> bool:
    """is_complete_elf on a file's first 64 bytes and its size."""
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return False
    order = "<" if head[5] == 1 else ">"
    if head[4] == 2:          # 64-bit
        shoff, shentsize, shnum = struct.unpack_from(order + "Q", head, 0x28)[0], *struct.unpack_from(
            order + "HH", head, 0x3A)
    else:
        shoff, shentsize, shnum = struct.unpack_from(order + "I", head, 0x20)[0], *struct.unpack_from(
            order + "HH", head, 0x2E)
    return 0 < shoff and shoff + shentsize * shnum <= size


def compile_library(target: Path, extra_flags: tuple = (), sources: tuple = SOURCES) -> None:
    """Compile `sources` with FLAGS + extra_flags into `target`, atomically (temporary file, then rename).
    extra_flags serve the tests, which build the AVX2 and portable paths on a CPU that has AVX-512."""
    compiler = find_compiler()
    target = Path(target)
    private_dir(target.parent, KERNEL_CACHE)
    for stale in target.parent.glob("*.tmp.so"):    # left by builds killed midway; a build takes minutes
        try:
            if time.time() - stale.lstat().st_mtime > STALE_BUILD_S:
                stale.unlink()
        except OSError:
            pass
    fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp.so", dir=target.parent)
    os.close(fd)
    try:
        cmd = [compiler, *FLAGS, *extra_flags, f"-Wl,--version-script={SOURCE_DIR / EXPORTS}", "-o", tmp,
               *(str(SOURCE_DIR / s) for s in sources)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling the ms_atb kernels failed:\n{' '.join(cmd)}\n{proc.stderr}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def call_kernel(fn, arrays) -> int:
    """Call kernel `fn` (a ctypes function of the library) through the aot C ABI on numpy arrays, the
    output(s) last, without MindSpore: for the tests and benchmarks of one kernel on one code path.
    Returns the kernel's status (0 on success)."""
    import ctypes
    n = len(arrays)
    params = (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays])
    ndims = (ctypes.c_int * n)(*[a.ndim for a in arrays])
    shapes = (ctypes.POINTER(ctypes.c_int64) * n)(
        *[(ctypes.c_int64 * max(a.ndim, 1))(*a.shape) for a in arrays])
    dtypes = (ctypes.c_char_p * n)(*[a.dtype.name.encode() for a in arrays])
    return fn(n, params, ndims, shapes, dtypes, None, None)


def aot_op(func_name: str, input_names: tuple, out_dtype, out_shape=None):
    """A mindspore.ops.Custom aot op on the CPU for kernel `func_name` of the library.

    One output: declared with reg_info and a C++ shape inference (`<func_name>InferShape`), the form under
    which MindSpore accepts it in graphs with dynamic shapes as well as static ones. Several outputs:
    out_dtype is a tuple of dtypes and out_shape a function of the input shapes returning a tuple of
    shapes (the C++ inference returns one shape), for static-shape graphs.
    One primitive per (library, kernel, inputs, dtypes, shape function) serves every Cell that asks: a
    primitive holds no per-call state, and a model has hundreds of calls of a dozen kernels (about 2 ms of
    CPU to create each).
    """
    key = (loaded_kernel_library(), func_name, tuple(input_names), out_dtype, out_shape)
    if key not in _AOT_OPS:
        _AOT_OPS[key] = _new_aot_op(func_name, input_names, out_dtype, out_shape)
    return _AOT_OPS[key]


_AOT_OPS: dict = {}


def _new_aot_op(func_name: str, input_names: tuple, out_dtype, out_shape):
    from mindspore import ops
    from mindspore.ops import CustomRegOp, DataType

    num_outputs = len(out_dtype) if isinstance(out_dtype, tuple) else 1
    if (num_outputs > 1) != (out_shape is not None):
        raise ValueError(f"{func_name}: out_shape goes with a tuple out_dtype (several outputs), and only then")
    reg = CustomRegOp(func_name)
    for i, name in enumerate(input_names):
        reg = reg.input(i, name)
    for i in range(num_outputs):
        reg = reg.output(i, f"out{i}" if num_outputs > 1 else "out")
    reg = reg.dtype_format(*([DataType.None_None] * (len(input_names) + num_outputs)))
    reg_info = reg.target("CPU").get_op_info()
    return ops.Custom(f"{loaded_kernel_library()}:{func_name}", out_shape=out_shape, out_dtype=out_dtype,
                      func_type="aot", reg_info=reg_info)
