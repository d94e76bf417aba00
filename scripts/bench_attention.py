"""paged_attention on SmolLM2 shapes: contiguous vs scattered block tables, each KV cache dtype against float32,
and the aot op's graph overhead.

Kernel times call the compiled kernel directly (ctypes, the same function MindSpore calls);
the overhead section times the op inside graph-mode Cells with static and dynamic shapes.
Usage: python scripts/bench_attention.py [--repeat N] [--dtypes-only] [--long-context]
--long-context: one decode row over 8,160 tokens with a float16 cache, a cache per layer of SmolLM2's 30 in turn
(188 MB: read from memory, not from the CPU's caches, as in a model's step), per layer and per byte.
"""
import argparse
import ctypes
import os
import platform
import subprocess
import time

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn

from ms_atb.ops import PagedAttention, build

H, KVH, D, BS = 9, 3, 64, 16  # SmolLM2-135M


def hardware() -> str:
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    cxx = subprocess.run([build.find_compiler(), "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return (f"{model}, {len(os.sched_getaffinity(0))} cores usable ({os.environ.get('MS_ATB_NUM_THREADS', 'all')} "
            f"kernel threads); Python {platform.python_version()}, MindSpore {ms.__version__}, numpy "
            f"{np.__version__}, {cxx}")


class Kernel:
    """Calls the library's PagedAttention (or PagedAttentionQuant) the way MindSpore's aot launcher does."""

    def __init__(self, name="PagedAttention"):
        self.fn = getattr(ctypes.CDLL(build.loaded_kernel_library()), name)
        self.fn.restype = ctypes.c_int

    def __call__(self, *arrays, names=None):
        arrays = [np.ascontiguousarray(a) for a in arrays]
        n = len(arrays)
        params = (ctypes.c_void_p * n)(*(a.ctypes.data for a in arrays))
        ndims = (ctypes.c_int * n)(*(a.ndim for a in arrays))
        shape_arrays = [(ctypes.c_int64 * max(a.ndim, 1))(*a.shape) for a in arrays]
        shapes = (ctypes.POINTER(ctypes.c_int64) * n)(*(ctypes.cast(s, ctypes.POINTER(ctypes.c_int64))
                                                        for s in shape_arrays))
        dtypes = (ctypes.c_char_p * n)(*(x.encode() for x in (names or [str(a.dtype) for a in arrays])))
        return lambda: self.fn(n, params, ndims, shapes, dtypes, None, None)


def workload(rng, seqs, layout):
    """seqs: (context_len, num_queries) -> kernel inputs and output, and the K/V bytes one call reads."""
    need = [(c + BS - 1) // BS for c, _ in seqs]
    nb = sum(need)
    ids = np.arange(nb, dtype=np.int32) if layout == "contiguous" else rng.permutation(nb).astype(np.int32)
    tables = np.zeros((len(seqs), max(need)), np.int32)
    pos = 0
    for b, n in enumerate(need):
        tables[b, :n] = ids[pos:pos + n]
        pos += n
    kc = rng.standard_normal((nb, BS, KVH, D)).astype(np.float32)
    vc = rng.standard_normal((nb, BS, KVH, D)).astype(np.float32)
    qsl = np.concatenate([[0], np.cumsum([q for _, q in seqs])]).astype(np.int32)
    query = rng.standard_normal((int(qsl[-1]), H, D)).astype(np.float32)
    lens = np.array([c for c, _ in seqs], np.int32)
    out = np.empty_like(query)
    kv_bytes = sum(c for c, _ in seqs) * KVH * D * 4 * 2  # each cached K/V row once
    flops = sum(4 * H * D * (c - q + i + 1) for c, q in seqs for i in range(q))  # QK and PV, causal
    return (query, kc, vc, tables, lens, qsl, np.array([D ** -0.5], np.float32), out), kv_bytes, flops


def time_call(fn, repeat):
    fn()
    best = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeat):
            assert fn() == 0
        best.append((time.perf_counter() - t0) / repeat)
    return min(best)


def bench_kernel(repeat):
    rng = np.random.default_rng(0)
    kernel = Kernel()
    cases = [("decode 32 x ctx 256", [(256, 1)] * 32), ("decode 32 x ctx 1024", [(1024, 1)] * 32),
             ("prefill 512 tokens", [(512, 512)]), ("prefill 166 after 992", [(1158, 166)])]
    print(f"{'workload':24s} {'layout':11s} {'us/call':>9s} {'GB/s K/V':>9s} {'GFLOP/s':>8s} {'scattered/contig':>17s}")
    for name, seqs in cases:
        times = {}
        for layout in ("contiguous", "scattered"):
            args, kv_bytes, flops = workload(rng, seqs, layout)
            times[layout] = time_call(kernel(*args), max(1, repeat // (20 if "prefill" in name else 1)))
            ratio = f"{times['scattered'] / times['contiguous']:.3f}" if layout == "scattered" else ""
            print(f"{name:24s} {layout:11s} {times[layout] * 1e6:9.1f} {kv_bytes / times[layout] / 1e9:9.2f} "
                  f"{flops / times[layout] / 1e9:8.1f} {ratio:>17s}")


def bench_cache_dtypes(repeat, seqs=((1024, 1),) * 32):
    """Decode of 32 sequences x 1,024 tokens of context (scattered tables), float32 queries, each cache dtype.
    Returns {dtype: seconds per call}; prints the K/V bytes read per second and the ratio to float32."""
    rng = np.random.default_rng(0)
    (query, kc, vc, tables, lens, qsl, scale, out), _, _ = workload(rng, list(seqs), "scattered")
    tokens = sum(c for c, _ in seqs)
    cases = {"float32": (kc, vc, [], "float32"), "float16": (kc.astype(np.float16), vc.astype(np.float16), [], "float16"),
             "bfloat16": ((kc.view(np.uint32) >> 16).astype(np.uint16), (vc.view(np.uint32) >> 16).astype(np.uint16),
                          [], "bfloat16")}
    amax_k, amax_v = np.abs(kc).max(-1), np.abs(vc).max(-1)            # [NB, BS, KVH]: per-row int8 scales
    cases["int8"] = (np.rint(kc / amax_k[..., None] * 127).astype(np.int8), np.rint(vc / amax_v[..., None] * 127).astype(
        np.int8), [(amax_k / 127).astype(np.float32), (amax_v / 127).astype(np.float32)], "int8")
    times = {}
    print(f"{'cache dtype':12s} {'bytes/value':>11s} {'us/call':>9s} {'GB/s K/V':>9s} {'vs float32':>10s}")
    for name, (k, v, scales, dtype_name) in cases.items():
        kernel = Kernel("PagedAttentionQuant" if scales else "PagedAttention")
        names = ["float32", dtype_name, dtype_name, "int32", "int32", "int32", "float32"] + ["float32"] * len(scales) + [
            "float32"]
        times[name] = time_call(kernel(query, k, v, tables, lens, qsl, scale, *scales, out, names=names), repeat)
        nbytes = tokens * KVH * 2 * (D * k.itemsize + 4 * bool(scales))
        print(f"{name:12s} {k.itemsize + 4 * bool(scales) / D:11.3f} {times[name] * 1e6:9.1f} "
              f"{nbytes / times[name] / 1e9:9.2f} {times['float32'] / times[name]:9.2f}x", flush=True)
    return times


def bench_long_context(repeat, ctx=8160, layers=30):
    """A decode row over ctx tokens (contiguous table, float16 cache), each call on the next layer's cache."""
    rng = np.random.default_rng(0)
    nb = (ctx + BS - 1) // BS
    caches = [(rng.standard_normal((nb, BS, KVH, D)).astype(np.float16),
               rng.standard_normal((nb, BS, KVH, D)).astype(np.float16)) for _ in range(layers)]
    query = rng.standard_normal((1, H, D)).astype(np.float32)
    rest = (np.arange(nb, dtype=np.int32)[None], np.array([ctx], np.int32), np.array([0, 1], np.int32),
            np.array([D ** -0.5], np.float32), np.empty_like(query))
    kernel = Kernel()
    calls = [kernel(query, k, v, *rest) for k, v in caches]
    seconds = time_call(lambda: sum(call() for call in calls), max(1, repeat // 10)) / layers
    nbytes = ctx * KVH * D * 2 * 2
    print(f"decode 1 row x ctx {ctx:,}, float16 cache, {layers} layers' caches in turn: {seconds * 1e6:.0f} us a layer, "
          f"{nbytes / seconds / 1e9:.1f} GB/s of K/V")


class Chain(nn.Cell):
    """n paged_attention calls in a row (each depending on the last), like n layers."""

    def __init__(self, n):
        super().__init__()
        self.key_cache = Parameter(Tensor(np.ones((4, BS, KVH, D), np.float32)), name="key_cache")
        self.value_cache = Parameter(Tensor(np.ones((4, BS, KVH, D), np.float32)), name="value_cache")
        self.pa = PagedAttention(H, KVH, D, D ** -0.5)
        self.n = n

    def construct(self, query, block_tables, context_lens, query_start_loc):
        for _ in range(self.n):
            query = self.pa(query, self.key_cache, self.value_cache, block_tables, context_lens, query_start_loc)
        return query


def bench_graph_overhead(repeat):
    ms.set_context(mode=ms.GRAPH_MODE)
    args = [Tensor(np.ones((1, H, D), np.float32)), Tensor(np.zeros((1, 1), np.int32)),
            Tensor(np.array([1], np.int32)), Tensor(np.array([0, 1], np.int32))]
    for shapes in ("static", "dynamic"):
        per = {}
        for n in (1, 31):
            cell = Chain(n)
            if shapes == "dynamic":
                cell.set_inputs(Tensor(shape=[None, H, D], dtype=ms.float32), Tensor(shape=[None, None], dtype=ms.int32),
                                Tensor(shape=[None], dtype=ms.int32), Tensor(shape=[None], dtype=ms.int32))
            per[n] = time_call(lambda: (cell(*args).asnumpy(), 0)[1], repeat)
        print(f"graph with {shapes:7s} shapes: 1 op {per[1] * 1e6:7.1f} us/step; each further op "
              f"{(per[31] - per[1]) / 30 * 1e6:6.1f} us (a 1-token, 1-block kernel)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--dtypes-only", action="store_true", help="only the cache-dtype table")
    parser.add_argument("--long-context", action="store_true", help="only the long-context decode row")
    args = parser.parse_args()
    print(hardware())
    if args.long_context:
        bench_long_context(args.repeat)
        return
    print(f"load average now: {os.getloadavg()[0]:.1f} (times are the best of 3 runs; a busy machine inflates them)")
    print(f"SmolLM2 shapes: {H} heads, {KVH} KV heads, head_dim {D}, block {BS}\n")
    print("decode 32 sequences x 1,024 tokens of context, scattered tables, float32 queries; 'vs float32' is "
          "float32's time / this dtype's (above 1: faster)")
    bench_cache_dtypes(args.repeat)
    if args.dtypes_only:
        return
    print("\nfloat32 caches")
    bench_kernel(args.repeat)
    print()
    bench_graph_overhead(args.repeat)


if __name__ == "__main__":
    main()
