"""The machine's limits the benchmarks set their figures against: memory bandwidth and our kernels' compute peaks.

- copy_bandwidth: bytes read + written per second by `threads` threads copying 1 GiB (numpy releases the GIL in a
  copy), best of a few.
- read_bandwidth: bytes read per second by `threads` threads streaming through 1 GiB (an OR reduction, which
  releases the GIL), best of a few: a decode step at one sequence reads every weight once and writes next to
  nothing, so weight bytes / this bandwidth is the least time a step can take. Hosts differ in how the two
  compare: two cores of an AMD EPYC without AVX-512 copy at 66-70 GB/s (read + written) but read at 32-36 GB/s.
- peak_gflops_fp32: our PackedMatMul on a hot 384 x 1536 x 3072 product (operands in cache).
- peak_gops_int8: our QuantDotQ4_0 (int8 activations) on a 512 x 2048 x 3072 product (a prompt's q/k/v of a
  1B model; the 3.4 MiB weight in L2/L3).
Both peaks run on the kernel library's own thread pool (MS_ATB_NUM_THREADS, read when the library loads).
"""
import ctypes
import os
import threading
import time

import numpy as np


def _threads_best(target, slices, repeats: int) -> float:
    """Seconds of target(*slice) run on one thread per slice, all at once: the best of repeats."""
    best = float("inf")
    for _ in range(repeats):
        workers = [threading.Thread(target=target, args=a) for a in slices]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - start)
    return best


def copy_bandwidth(threads: int, nbytes: int = 1 << 30, repeats: int = 3) -> float:
    """Read + write bytes per second of copying nbytes in `threads` threads (each its own slice), best of repeats."""
    src = np.ones(nbytes // 8, np.float64)
    dst = np.empty_like(src)
    parts = np.array_split(np.arange(src.size), threads)

    def copy(lo, hi):
        np.copyto(dst[lo:hi], src[lo:hi])
    return 2 * src.nbytes / _threads_best(copy, [(p[0], p[-1] + 1) for p in parts], repeats)


def read_bandwidth(threads: int, nbytes: int = 1 << 30, repeats: int = 3) -> float:
    """Bytes read per second by `threads` threads OR-reducing nbytes (each its own slice), best of repeats."""
    words = np.ones(nbytes // 8, np.uint64)
    return words.nbytes / _threads_best(np.bitwise_or.reduce, [(p,) for p in np.array_split(words, threads)], repeats)


def _best(call, repeats: int = 7, inner: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            call()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def peak_gflops_fp32() -> float:
    from ms_atb.ops import build
    from ms_atb.ops.matmul import pack_weight
    lib = ctypes.CDLL(build.kernel_library())
    rng = np.random.default_rng(0)
    m, k, n = 384, 1536, 3072
    x, w = rng.standard_normal((m, k), np.float32), pack_weight(rng.standard_normal((k, n), np.float32))
    y = np.zeros((m, n), np.float32)
    return 2 * m * k * n / _best(lambda: build.call_kernel(lib.PackedMatMul, [x, w, y])) / 1e9


def peak_gops_int8() -> float:
    from ms_atb.ops import build
    from ms_atb.ops.quant_matmul import pack_gguf
    lib = ctypes.CDLL(build.kernel_library())
    rng = np.random.default_rng(0)
    m, k, n = 512, 2048, 3072                               # weight: 3072 x 2048 Q4_0 = 3.4 MiB
    raw = rng.integers(0, 256, (n, k // 32, 18), np.uint8)
    raw[..., :2] = np.full((n, k // 32, 1), 0.01, np.float16).view(np.uint8)
    w = pack_gguf(raw.reshape(n, -1), "q4_0", k, "int8")
    x, y = rng.standard_normal((m, k), np.float32), np.zeros((m, n), np.float32)
    return 2 * m * k * n / _best(lambda: build.call_kernel(lib.QuantDotQ4_0, [x, w, y])) / 1e9


def host_line() -> str:
    """CPU model, cores this process may use, 1-minute load average."""
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return f"{model}, {len(os.sched_getaffinity(0))} cores, load average {os.getloadavg()[0]:.2f}"
