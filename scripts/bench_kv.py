"""The article's table on this machine: static pre-allocation vs paged vs paged + prefix caching, SmolLM2-135M.

One engine is built (graphs compiled) once; LLM.reset_scheduler() switches the mode and empties the KV cache
between runs. Every step the scheduler's state is sampled: running requests, tokens held, slots reserved
(static: running x ceil(max_model_len / 16) x 16; paged: distinct blocks held x 16, a shared block counted
once). TTFT: requests submitted one after another, each once the previous has finished; beside each ratio,
the same ratio of prefill FLOPs (its floor at uniform efficiency).
The default KV budget is the issue's: 1,456 blocks of 16 tokens x 45 KiB = 1 GiB (static holds 11 requests of
max_model_len 2,048), with 48 requests so that paged mode is saturated (~12 min on 2 cores).
    .venv/bin/python scripts/bench_kv.py [--num-blocks 1456] [--requests 48] [--no-kernel]
    .venv/bin/python scripts/bench_kv.py --num-blocks 512 --requests 16     # 360 MiB, ~5 min
With --cache-dtypes auto,float16,bfloat16,int8 an engine per further KV cache dtype then runs paged and
paged + prefix at the same budget in bytes (more blocks of a narrower dtype): concurrency, utilisation, TTFT.
"""
import argparse
import gc
import json
import math
import os
import platform
import sys
import time

import numpy as np

from script_args import require_at_least, writable_output

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MODES = {"static": dict(allocation="static", enable_prefix_caching=False),
         "paged": dict(allocation="contiguous", enable_prefix_caching=False),
         "paged+prefix": dict(allocation="contiguous", enable_prefix_caching=True)}


class Recorder:
    """Wraps scheduler.schedule() to sample the KV state after each step is scheduled."""

    def __init__(self, sched, static: bool):
        self.sched, self.static = sched, static
        self.rows: list[tuple] = []     # (t, running, waiting, tokens held, slots reserved, blocks held)
        self.hook_s = 0.0
        self.t0 = time.perf_counter()
        inner = sched.schedule

        def schedule():
            step = inner()
            self.sample()
            return step
        sched.schedule = schedule

    def sample(self) -> None:
        t = time.perf_counter()
        s, bm = self.sched, self.sched.block_manager
        bs = bm.block_size
        filled: dict[int, int] = {}     # physical block -> tokens in it
        for seq in s.running:
            n = s._num_slots.get(seq.request_id, seq.num_tokens)
            for i, b in enumerate(bm.block_table(seq.request_id)):
                filled[b] = max(filled.get(b, 0), min(bs, n - i * bs))
        held = sum(filled.values())
        reserved = (len(s.running) * s.static_blocks_per_seq * bs) if self.static else len(filled) * bs
        self.rows.append((t - self.t0, len(s.running), len(s.waiting), held, reserved, len(filled)))
        self.hook_s += time.perf_counter() - t

    def summary(self, end: float) -> dict:
        r = np.array(self.rows, dtype=np.float64)          # [steps, 6]
        dt = np.diff(np.append(r[:, 0], end - self.t0))    # time until the next step
        util = np.divide(r[:, 3], r[:, 4], out=np.zeros(len(r)), where=r[:, 4] > 0)
        busy = r[:, 2] > 0                                 # some request waits: the KV budget binds
        return {"peak_running": int(r[:, 1].max()),
                "mean_running_while_waiting": float(np.average(r[busy, 1], weights=dt[busy])) if busy.any()
                else float("nan"),
                "kv_utilisation": float(np.average(util, weights=dt)),
                "steps": len(r)}


def make_prompts(rng, n, lo, hi, vocab, prefix=()):
    top = min(49000, vocab)     # ids from 100: clear of SmolLM2's special tokens
    return [list(prefix) + rng.integers(100, top, int(rng.integers(lo, hi + 1))).tolist() for _ in range(n)]


def workloads(args, vocab) -> dict:
    rng = np.random.default_rng(args.seed)
    system = make_prompts(rng, 1, args.system_len, args.system_len, vocab)[0]
    outs = [int(x) for x in rng.integers(args.output[0], args.output[1] + 1, args.requests)]
    return {"no shared prompt": (make_prompts(rng, args.requests, *args.prompt, vocab), outs),
            f"shared {args.system_len}-token system prompt": (
                make_prompts(rng, args.requests, *args.user, vocab, prefix=system), outs)}, system


def run_batch(llm, mode, prompts, outs, num_blocks):
    from ms_atb import SamplingParams
    llm.reset_scheduler(num_blocks=num_blocks, **MODES[mode])
    rec = Recorder(llm.scheduler, static=mode == "static")
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in outs]
    start = time.perf_counter()
    res = llm.generate(prompts, params, use_tqdm=False)
    end = time.perf_counter()
    assert [len(o.token_ids) for o in res] == outs
    s = llm.stats()
    elapsed = end - start - rec.hook_s
    fed = s["num_computed_tokens"]                  # every token fed to the model, decode included
    out = rec.summary(end)
    out.update(output_tok_s=sum(outs) / elapsed, elapsed_s=elapsed, preemptions=s["num_preemptions"],
               prefill_computed=fed - sum(n - 1 for n in outs), prompt_tokens=sum(map(len, prompts)),
               contiguity=s["contiguity"], allocation_contiguity=s["allocation_contiguity"],
               prefix_hit_rate=s["prefix_cache_hit_rate"], timeline=rec.rows)
    return out


def run_ttft(llm, mode, prompts, num_blocks, block_size, system_len, repeats=1):
    """Each request alone, submitted once the previous finished: TTFT is its own prefill. The sequence runs
    `repeats` times from an empty cache; each request's TTFT is the median over the repeats."""
    from ms_atb import SamplingParams
    runs, computed = [], []
    for _ in range(repeats):
        llm.reset_scheduler(num_blocks=num_blocks, **MODES[mode])
        ttfts, computed = [], []
        for p in prompts:
            before = llm.scheduler.num_computed_prompt_tokens
            o = llm.generate([p], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True), use_tqdm=False)[0]
            ttfts.append(o.metrics.ttft * 1000)
            computed.append(llm.scheduler.num_computed_prompt_tokens - before)
        runs.append(ttfts)
    cached = system_len // block_size * block_size if mode == "paged+prefix" else 0
    expect = [len(prompts[0])] + [len(p) - cached for p in prompts[1:]]
    return {"ttft_ms": [float(np.median(col)) for col in zip(*runs)], "ttft_ms_runs": runs,
            "computed": computed, "expected": expect}


def engine_for(args, cache_dtype, budget):
    """An engine whose KV pool in cache_dtype fills the same number of bytes."""
    from ms_atb import LLM
    from ms_atb.formats.loader import load_config
    from ms_atb.config import EngineConfig
    from ms_atb.worker.model_runner import kv_cache_bytes_per_block
    cfg = EngineConfig.load(args.config)
    per_block = kv_cache_bytes_per_block(load_config(cfg.model.path), cfg.kv_cache.block_size, cfg.model.dtype, 1,
                                         cache_dtype)
    return LLM(args.config, num_blocks=int(budget // per_block), max_num_seqs=args.max_num_seqs,
               max_num_batched_tokens=args.max_num_batched_tokens, cache_dtype=cache_dtype,
               precompile=True)             # every graph before any clock starts


def dtype_rows(llm, args, wls, seq_prompts, system, done):
    """paged and paged + prefix on each workload, and their sequential TTFT, for this engine's cache dtype (reusing
    `done`, the main tables' results, when given)."""
    bs, n = llm.config.kv_cache.block_size, llm.num_blocks
    rows = {"num_blocks": n, "bytes_per_block": llm.kv_bytes_per_block, "batch": {}, "ttft": {}}
    for mode in ("paged", "paged+prefix"):
        for wname, (prompts, outs) in ({} if args.no_batch else wls).items():
            rows["batch"][(wname, mode)] = (done["batch"][wname][mode] if done else
                                            run_batch(llm, mode, prompts, outs, n))
        rows["ttft"][mode] = done["ttft"][mode] if done else run_ttft(llm, mode, seq_prompts, n, bs, args.system_len,
                                                                       args.ttft_repeats)
        print(f"  {llm.cache_dtype} {mode}: done", flush=True)
    return rows


def print_dtype_table(by_dtype, budget, bs):
    print(f"\n### The same KV budget ({budget / 2 ** 20:.0f} MiB) in each cache dtype\n")
    print("| cache dtype | bytes / block | blocks (tokens) | workload | mode | peak running | mean running while "
          "queued | KV utilisation | output tok/s | preemptions | TTFT 1st / next ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for d, rows in by_dtype.items():
        for (wname, mode), r in rows["batch"].items():
            t = rows["ttft"][mode]["ttft_ms"]
            print(f"| {d} | {rows['bytes_per_block']:,} | {rows['num_blocks']:,} ({rows['num_blocks'] * bs:,}) | "
                  f"{wname} | {mode} | {r['peak_running']} | {r['mean_running_while_waiting']:.1f} | "
                  f"{r['kv_utilisation']:.1%} | {r['output_tok_s']:.1f} | {r['preemptions']} | "
                  f"{t[0]:.0f} / {np.mean(t[1:]):.0f} |", flush=True)
    for rows in by_dtype.values():      # JSON keys must be strings
        rows["batch"] = {f"{w} | {m}": r for (w, m), r in rows["batch"].items()}


def hardware() -> str:
    import mindspore
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return (f"{model}; {len(os.sched_getaffinity(0))} cores usable; Python {platform.python_version()}, "
            f"MindSpore {mindspore.__version__}, numpy {np.__version__}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "smollm2_135m.yaml"))
    ap.add_argument("--num-blocks", type=int, default=1456, help="KV budget in blocks of 16 tokens (1456: 1 GiB)")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--prompt", type=int, nargs=2, default=[512, 1024], metavar=("LO", "HI"))
    ap.add_argument("--system-len", type=int, default=1000)
    ap.add_argument("--user", type=int, nargs=2, default=[32, 160], metavar=("LO", "HI"))
    ap.add_argument("--output", type=int, nargs=2, default=[32, 128], metavar=("LO", "HI"))
    ap.add_argument("--ttft-requests", type=int, default=4)
    ap.add_argument("--ttft-repeats", type=int, default=3, help="runs of the sequential-TTFT sequence (median)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-kernel", action="store_true", help="skip the attention-kernel table")
    ap.add_argument("--no-batch", action="store_true", help="skip the concurrency tables (TTFT only)")
    ap.add_argument("--kernel-repeat", type=int, default=20)
    ap.add_argument("--cache-dtypes", default="auto",
                    help="KV cache dtypes, comma-separated, the first the main tables' (auto: the model's float32)")
    ap.add_argument("--json", default=os.path.join(ROOT, "out", "bench_kv.json"))
    args = ap.parse_args()
    require_at_least(ap, args, 1, "num_blocks", "max_num_seqs", "max_num_batched_tokens", "requests", "ttft_repeats",
                     "kernel_repeat")
    require_at_least(ap, args, 2, "ttft_requests", why=" (the first request, then the ones that reuse it)")
    require_at_least(ap, args, 0, "system_len")
    writable_output(ap, args.json, "--json")
    for name in ("prompt", "user", "output"):
        lo, hi = getattr(args, name)
        if not 1 <= lo <= hi:
            ap.error(f"--{name} LO HI needs 1 <= LO <= HI, got {lo} {hi}")

    dtypes = args.cache_dtypes.split(",")
    if any(d not in ("auto", "float16", "bfloat16", "int8") for d in dtypes):
        ap.error(f"--cache-dtypes: each must be one of auto, float16, bfloat16, int8; got {args.cache_dtypes!r}")

    from ms_atb import LLM
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    llm = LLM(args.config, num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, cache_dtype=dtypes[0],
              precompile=True)              # every graph before any clock starts
    from ms_atb import SamplingParams
    llm.generate([[100] * 40], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)  # one-time costs
    bs, max_len = llm.config.kv_cache.block_size, llm.max_model_len
    kv_token = llm.kv_bytes_per_block / bs
    static_cap = args.num_blocks // math.ceil(max_len / bs)
    print(f"hardware: {hardware()}; load average at start {load0:.2f}")
    print(f"engine: {os.path.relpath(args.config, ROOT)}, built in {time.perf_counter() - t0:.0f} s; KV "
          f"{kv_token / 1024:.0f} KiB/token (fp32); budget {args.num_blocks} blocks x {bs} tokens = "
          f"{args.num_blocks * bs} tokens = {args.num_blocks * llm.kv_bytes_per_block / 2 ** 20:.0f} MiB "
          f"({llm.cache_dtype}); "
          f"max_model_len {max_len} (static holds {static_cap}); max_num_seqs {args.max_num_seqs}, "
          f"max_num_batched_tokens {args.max_num_batched_tokens}")
    vocab = llm.model_config.vocab_size
    wls, system = workloads(args, vocab)
    print(f"workload (seed {args.seed}, uniform, random token ids, ignore_eos, greedy): {args.requests} requests "
          f"submitted at once; outputs {args.output[0]}-{args.output[1]} tokens; no shared prompt: prompts "
          f"{args.prompt[0]}-{args.prompt[1]}; shared: {args.system_len}-token system prompt + user "
          f"{args.user[0]}-{args.user[1]}")
    results = {"config": vars(args), "hardware": hardware(), "kv_bytes_per_token": kv_token,
               "static_capacity": static_cap, "batch": {}, "ttft": {}}
    for wname, (prompts, outs) in ({} if args.no_batch else wls).items():
        print(f"\n### {wname}: {args.requests} requests, prompt tokens {sum(map(len, prompts))}, "
              f"output tokens {sum(outs)}\n")
        print("| mode | peak running | vs static | mean running while queued | KV utilisation | output tok/s | "
              "prefill tokens computed | preemptions | contiguity (appended / allocations) |")
        print("|---|---|---|---|---|---|---|---|---|")
        rows = {}
        for mode in MODES:
            r = rows[mode] = run_batch(llm, mode, prompts, outs, args.num_blocks)
            contig = "-" if mode == "static" else f"{r['contiguity']:.0%} / {r['allocation_contiguity']:.0%}"
            print(f"| {mode} | {r['peak_running']} | {r['peak_running'] / rows['static']['peak_running']:.2f}x | "
                  f"{r['mean_running_while_waiting']:.1f} | {r['kv_utilisation']:.1%} | {r['output_tok_s']:.1f} | "
                  f"{r['prefill_computed']:,} of {r['prompt_tokens']:,} | {r['preemptions']} | {contig} |", flush=True)
        results["batch"][wname] = rows

    rng = np.random.default_rng(args.seed + 1)
    seq_prompts = make_prompts(rng, args.ttft_requests, *args.user, vocab, prefix=system)
    print(f"\n### TTFT: {args.ttft_requests} requests one after another ({args.system_len}-token system prompt + "
          f"user {args.user[0]}-{args.user[1]}; lengths {[len(p) for p in seq_prompts]}), max_tokens 1; median of "
          f"{args.ttft_repeats} runs from an empty cache\n")
    # The arithmetic floor of the ratio: prefill FLOPs of each next request over the first's (cost_model.py:
    # linears per token, attention per (query, context) pair), i.e. the ratio an engine running every
    # matmul and attention at one speed would measure.
    from ms_atb.sim.cost_model import THIS_CPU, CostModel, ModelShape
    cm = CostModel(ModelShape.from_config(llm.model_config, 4), THIS_CPU)

    def flops(computed, prompt):
        return cm.cost([computed], [len(prompt)], 1).flops
    print("| mode | TTFT 1st ms | TTFT of each next ms | each next / 1st (max) | max ratio in each run | "
          "FLOPs of each next / 1st | prefill computed per request | only the tail past the cached whole blocks? |")
    print("|---|---|---|---|---|---|---|---|")
    for mode in MODES:
        r = results["ttft"][mode] = run_ttft(llm, mode, seq_prompts, args.num_blocks, bs, args.system_len,
                                             args.ttft_repeats)
        first, nxt = r["ttft_ms"][0], r["ttft_ms"][1:]
        ratios = [t / first for t in nxt]
        per_run = [max(t / run[0] for t in run[1:]) for run in r["ttft_ms_runs"]]
        work = [flops(c, p) for c, p in zip(r["computed"], seq_prompts)]
        r["flop_ratio"] = [w / work[0] for w in work[1:]]
        print(f"| {mode} | {first:.0f} | {', '.join(f'{t:.0f}' for t in nxt)} | "
              f"{', '.join(f'{x:.1%}' for x in ratios)} ({max(ratios):.1%}) | "
              f"{', '.join(f'{x:.1%}' for x in per_run)} | {', '.join(f'{x:.1%}' for x in r['flop_ratio'])} | "
              f"{r['computed']} | "
              f"{'yes' if r['computed'] == r['expected'] else 'NO, expected ' + str(r['expected'])} |", flush=True)

    if len(dtypes) > 1:
        budget = args.num_blocks * llm.kv_bytes_per_block
        results["dtypes"] = {llm.cache_dtype: dtype_rows(llm, args, wls, seq_prompts, system, results)}
        for d in dtypes[1:]:
            del llm
            gc.collect()
            llm = engine_for(args, d, budget)
            results["dtypes"][llm.cache_dtype] = dtype_rows(llm, args, wls, seq_prompts, system, None)
        print_dtype_table(results["dtypes"], budget, bs)

    if not args.no_kernel:
        print("\n### attention kernel: scattered vs contiguous block tables (scripts/bench_attention.py)\n")
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_attention
        bench_attention.bench_kernel(args.kernel_repeat)
    results["load_end"] = os.getloadavg()[0]
    print(f"\nload average at end: {results['load_end']:.2f}")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f)
    print(f"results and per-step timelines: {args.json}")


if __name__ == "__main__":
    main()
