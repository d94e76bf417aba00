"""Our PackedMatMul kernel on each instruction-set path this CPU runs, called through its C ABI (no MindSpore).

Builds the kernel library as -march=native builds it (AVX-512 tile of 12 rows x a pair of 16-column panels where
the CPU has AVX-512) and again without AVX-512 (the AVX2 6 x 16 tile), then times, alternating the variants:
  hot:  single products with operands in cache (best of 7), SmolLM2's shapes at 32 and 512 rows;
  step: one decode step's matmuls with cold weights: SmolLM2's 30 layers x (qkv, o, gate_up, down) + lm_head,
        540 MB of distinct weights, more than the caches hold, at M rows (best of 5).
    .venv/bin/python scripts/bench_gemm.py [--rows 8 32]
With --quant FMT..., QuantMatMul instead: per weight format, one decode step's matmuls (the same shapes, the
weights quantized: 70-140 MB) and the lm_head alone, at M rows (best of 5), for this tree's kernels and for
each library given with --against (e.g. one built from another checkout, to compare two versions in one run):
    .venv/bin/python scripts/bench_gemm.py --quant q4_1 q8_0 --rows 1 8 32 --against /path/to/other.so
--activations float32 int8 times both QuantMatMul (float32 activations) and QuantDot (int8 activations, the
weights in the dot layout) over the same weights, alternating, in one run.
"""
import argparse
import ctypes
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ms_atb.ops import build  # noqa: E402
from ms_atb.ops.matmul import pack_weight  # noqa: E402
from ms_atb.ops.quant_matmul import ACTIVATIONS, FORMATS, GGUF_BLOCK_BYTES, pack_gguf, quantize_int8  # noqa: E402

HIDDEN, QKV, INTER, VOCAB, LAYERS = 576, 960, 1536, 49152, 30  # SmolLM2-135M


def cpu_flags() -> set:
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def call(lib, x, w, y) -> None:
    if build.call_kernel(lib.PackedMatMul, [x, w, y]) != 0:
        raise RuntimeError("PackedMatMul failed")


QUANT_KERNELS = {"q8_0": "QuantMatMulQ8_0", "q4_0": "QuantMatMulQ4_0", "q4_1": "QuantMatMulQ4_1",
                 "int8": "QuantMatMulInt8"}
DOT_KERNELS = {"q8_0": "QuantDotQ8_0", "q4_0": "QuantDotQ4_0", "q4_1": "QuantDotQ4_1", "int8": "QuantDotInt8"}


def random_quantized(fmt: str, k: int, n: int, rng, activations=("float32",)) -> dict:
    """{activations: a packed [K, N] weight in that kernel's layout}, all of the same random blocks: random
    quants, scales (and Q4_1 minimums) of a trained model's size (float16 0.001-0.02, never subnormal)."""
    if fmt == "int8":
        w = rng.standard_normal((k, n), np.float32) * 0.02
        return {a: quantize_int8(w, a) for a in activations}
    raw = rng.integers(0, 256, (n, k // 32, GGUF_BLOCK_BYTES[fmt]), np.uint8)
    halves = 2 if fmt == "q4_1" else 1
    raw[..., :2 * halves] = rng.uniform(0.001, 0.02, (n, k // 32, halves)).astype(np.float16).view(np.uint8)
    return {a: pack_gguf(raw.reshape(n, -1), fmt, k, a) for a in activations}


def quant_main(args) -> None:
    tmp = tempfile.mkdtemp(prefix="ms_atb_gemm_")
    path = os.path.join(tmp, "this.so")
    build.compile_library(path, (), sources=("quant_matmul.cc",))
    libs = {"this tree": ctypes.CDLL(path)}
    for other in args.against:
        libs[os.path.basename(other)] = ctypes.CDLL(os.path.abspath(other))
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"CPU: {model}, {len(os.sched_getaffinity(0))} cores (MS_ATB_NUM_THREADS="
          f"{os.environ.get('MS_ATB_NUM_THREADS', 'all')}), load average {os.getloadavg()[0]:.2f}")
    rng = np.random.default_rng(0)
    shapes = [(HIDDEN, QKV), (HIDDEN, HIDDEN), (HIDDEN, 2 * INTER), (INTER, HIDDEN)] * LAYERS + [(HIDDEN, VOCAB)]
    # (column name, library, activations): QuantDot only where the library has it.
    runs = [(name if len(args.activations) == 1 else f"{name} {act}", lib, act) for name, lib in libs.items()
            for act in args.activations if act == "float32" or hasattr(lib, DOT_KERNELS["q8_0"])]
    for fmt in args.quant:
        weights = [random_quantized(fmt, k, n, rng, args.activations) for k, n in shapes]
        sets = {"decode step": list(zip(shapes, weights)), "lm_head": [(shapes[-1], weights[-1])]}
        for title, mats in sets.items():
            mbytes = sum(w[args.activations[0]].nbytes for _, w in mats) / 1e6
            print(f"\n{fmt}, {title} ({len(mats)} matmuls, {mbytes:.1f} MB of weights), best of 5:")
            for m in args.rows:
                xs = {k: rng.standard_normal((m, k), np.float32) for k in (HIDDEN, INTER)}
                ys = {n: np.zeros((m, -(-n // 16) * 16), np.float32) for _, n in shapes}
                best = {name: float("inf") for name, _, _ in runs}
                cpu = dict(best)
                for _ in range(5):
                    for name, lib, act in runs:
                        kernel = (DOT_KERNELS if act == "int8" else QUANT_KERNELS)[fmt]
                        fn = getattr(lib, kernel)
                        start, start_cpu = time.perf_counter(), time.thread_time()
                        for (k, n), w in mats:
                            if build.call_kernel(fn, [xs[k], w[act], ys[n]]) != 0:
                                raise RuntimeError(f"{kernel} failed")
                        best[name] = min(best[name], time.perf_counter() - start)
                        cpu[name] = min(cpu[name], time.thread_time() - start_cpu)
                # cpu: this thread's CPU time, free of the time a busy host gives to other processes; with
                # MS_ATB_NUM_THREADS=1 it is the whole of the kernels' work.
                print(f"  M = {m:3d}: " + "  ".join(
                    f"{name} {t * 1e3:7.2f} ms ({mbytes / 1e3 / t:4.1f} GB/s; cpu {cpu[name] * 1e3:7.2f} ms, "
                    f"{mbytes / 1e3 / cpu[name]:4.1f} GB/s)" for name, t in best.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 32], help="M of the cold decode-step test")
    ap.add_argument("--quant", nargs="+", choices=FORMATS, default=[], help="time QuantMatMul of these formats")
    ap.add_argument("--against", nargs="*", default=[], help="other kernel libraries to time (with --quant)")
    ap.add_argument("--activations", nargs="+", choices=ACTIVATIONS, default=["float32"],
                    help="with --quant: QuantMatMul (float32) and/or QuantDot (int8 activations)")
    args = ap.parse_args()
    if args.quant:
        quant_main(args)
        return
    flags = cpu_flags()
    variants = {"native": ()}
    if "avx512f" in flags:
        variants = {"native (AVX-512)": (), "AVX2 tile": ("-mno-avx512f",)}
    tmp = tempfile.mkdtemp(prefix="ms_atb_gemm_")
    libs = {}
    for name, extra in variants.items():
        path = os.path.join(tmp, f"{len(libs)}.so")
        build.compile_library(path, extra, sources=("matmul.cc",))
        libs[name] = ctypes.CDLL(path)
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"CPU: {model}, {len(os.sched_getaffinity(0))} cores, AVX-512: {'avx512f' in flags}; "
          f"load average {os.getloadavg()[0]:.2f}")
    rng = np.random.default_rng(0)
    print("\nhot (operands in cache), GFLOP/s, best of 7:")
    for m, k, n in [(32, HIDDEN, QKV), (32, HIDDEN, 2 * INTER), (32, INTER, HIDDEN), (512, HIDDEN, 2 * INTER),
                    (512, INTER, HIDDEN)]:
        x, w = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
        packed, y = pack_weight(w), np.zeros((m, -(-n // 16) * 16), np.float32)
        best = dict.fromkeys(libs, float("inf"))
        reps = max(3, int(1e9 / (2 * m * k * n)))
        for lib in libs.values():
            call(lib, x, packed, y)
            np.testing.assert_allclose(y[:, :n], x @ w, rtol=1e-3, atol=1e-3)
        for _ in range(7):
            for name, lib in libs.items():
                start = time.perf_counter()
                for _ in range(reps):
                    call(lib, x, packed, y)
                best[name] = min(best[name], (time.perf_counter() - start) / reps)
        print(f"  [{m:3d}, {k:4d}] x [{k:4d}, {n:5d}]: " +
              "  ".join(f"{name} {2 * m * k * n / t / 1e9:6.1f}" for name, t in best.items()))
    shapes = [(HIDDEN, QKV), (HIDDEN, HIDDEN), (HIDDEN, 2 * INTER), (INTER, HIDDEN)] * LAYERS + [(HIDDEN, VOCAB)]
    weights = [rng.standard_normal((n // 16, k, 16), np.float32) for k, n in shapes]
    mbytes = sum(w.nbytes for w in weights) / 1e6
    print(f"\none decode step's matmuls, cold weights ({mbytes:.0f} MB), best of 5:")
    for m in args.rows:
        xs = {k: rng.standard_normal((m, k), np.float32) for k in (HIDDEN, INTER)}
        ys = {n: np.zeros((m, n), np.float32) for _, n in shapes}
        flops = sum(2 * m * k * n for k, n in shapes)
        best = dict.fromkeys(libs, float("inf"))
        for _ in range(5):
            for name, lib in libs.items():
                start = time.perf_counter()
                for (k, n), w in zip(shapes, weights):
                    call(lib, xs[k], w, ys[n])
                best[name] = min(best[name], time.perf_counter() - start)
        print(f"  M = {m:3d}: " + "  ".join(f"{name} {t * 1e3:6.1f} ms ({flops / t / 1e9:5.1f} GFLOP/s, "
                                            f"{mbytes / 1e3 / t:4.1f} GB/s of weights)" for name, t in best.items()))


if __name__ == "__main__":
    main()
