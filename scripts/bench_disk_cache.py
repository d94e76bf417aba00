"""The KV disk tier (kv_cache.disk_cache_dir) on SmolLM2, four measurements; every run is a fresh process, greedy,
ignore_eos, graphs compiled (or loaded) before any clock starts:

  shared    a job of --requests prompts sharing a --system-len system prompt, each with its own --user LO-HI tokens,
            run twice with one tier directory: prefill tokens computed by the second run against the first's,
            the TTFT of each run's first request, and the outputs (identical).
  distinct  --prefixes few-shot prompts of --prefix-len tokens, --per-prefix requests each, arriving in rounds
            (fcfs), on a pool that holds about --pool-prefixes of them: prefill computed and total time without
            the tier and with a fresh one (blocks evicted from the pool come back from disk).
  noreuse   --requests prompts sharing nothing: output tok/s and CPU seconds without the tier and with a fresh one
            (the tier's overhead: copies out of the pool, the writer thread's checksums and writes).
  readspeed a --prefix-len prompt's blocks read back from the tier (open, read, check, copy into the pool) against
            recomputing them (the prefill's time per block); the page cache is warm (just written). The same for
            one block of a 7B-shaped model in the simulator (scripts/simulate_tier.py's cost model).

    .venv/bin/python scripts/bench_disk_cache.py shared                     # minutes on 2 cores
    .venv/bin/python scripts/bench_disk_cache.py distinct --prefixes 40 --prefix-len 2000
    .venv/bin/python scripts/bench_disk_cache.py noreuse
    .venv/bin/python scripts/bench_disk_cache.py readspeed
Wall-clock figures need a quiet machine; prefill token counts and hit counts do not.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

from script_args import require_at_least

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SCENARIOS = ("shared", "distinct", "noreuse", "readspeed")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=SCENARIOS)
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "smollm2_135m.yaml"))
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--system-len", type=int, default=1000)
    p.add_argument("--user", type=int, nargs=2, default=[150, 250], metavar=("LO", "HI"))
    p.add_argument("--output-len", type=int, default=16, help="output tokens of every request")
    p.add_argument("--prefixes", type=int, default=40)
    p.add_argument("--prefix-len", type=int, default=2000)
    p.add_argument("--per-prefix", type=int, default=2)
    p.add_argument("--pool-prefixes", type=int, default=10, help="distinct: prefixes the pool holds")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--cache-dtype", default="auto")
    p.add_argument("--dir", default=None, help="the tier directory (default: a fresh temporary one per scenario)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)     # one run, in a process of its own
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)     # what a child run is given again
    require_at_least(p, args, 1, "requests", "system_len", "output_len", "prefixes", "prefix_len", "per_prefix",
                     "pool_prefixes", "max_num_seqs", "max_num_batched_tokens")
    if not 1 <= args.user[0] <= args.user[1]:
        p.error(f"--user LO HI needs 1 <= LO <= HI, got {args.user[0]} {args.user[1]}")
    return args


# ---- workloads: (prompts, max_tokens) --------------------------------------------------------------------
def workload(args) -> list[list[int]]:
    from ms_atb.config import EngineConfig
    from ms_atb.formats.loader import load_config
    vocab = load_config(EngineConfig.load(args.config).model.path).vocab_size
    lo, hi = (100, min(vocab, 49000)) if vocab > 1000 else (1, vocab)     # clear of a tokenizer's special ids
    rng = random.Random(args.seed)

    def _ids(rng, n):
        return [rng.randrange(lo, hi) for _ in range(n)]
    if args.scenario == "shared":
        system = _ids(rng, args.system_len)
        return [system + _ids(rng, rng.randint(*args.user)) for _ in range(args.requests)]
    if args.scenario == "distinct":
        prefixes = [_ids(rng, args.prefix_len) for _ in range(args.prefixes)]
        return [p + _ids(rng, rng.randint(*args.user)) for _ in range(args.per_prefix) for p in prefixes]
    if args.scenario == "noreuse":
        return [_ids(rng, args.system_len + rng.randint(*args.user)) for _ in range(args.requests)]
    return [_ids(rng, args.prefix_len)]


# ---- one run, in a fresh process ---------------------------------------------------------------------------
def child(args, spec: dict) -> dict:
    from ms_atb import LLM, SamplingParams
    llm = LLM(args.config, num_blocks=spec["num_blocks"], max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=spec["max_model_len"],
              cache_dtype=args.cache_dtype, precompile=True, disk_cache_dir=spec["dir"] or "")
    prompts = workload(args)
    params = SamplingParams(max_tokens=spec.get("max_tokens", args.output_len), temperature=0.0, ignore_eos=True)
    t0, c0 = time.perf_counter(), time.process_time()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    t1 = time.perf_counter()
    llm.flush_disk_cache()
    s = llm.stats()
    decode = sum(len(o.token_ids) - 1 for o in outs)
    return {"tokens": [o.token_ids for o in outs], "ttft_first_s": outs[0].metrics.ttft, "elapsed_s": elapsed,
            "cpu_s": cpu, "flush_s": time.perf_counter() - t1, "output_tokens": sum(len(o.token_ids) for o in outs),
            "prefill_computed": s["num_computed_tokens"] - decode, "prompt_tokens": sum(map(len, prompts)),
            "disk_hit_tokens": s["disk_cache_hit_tokens"], "disk_written_blocks": s["disk_cache_written_blocks"],
            "preemptions": s["num_preemptions"], "bytes_per_block": s["bytes_per_block"]}


def run_child(args, **spec) -> dict:
    argv = [sys.executable, os.path.abspath(__file__), *args.argv, "--child", json.dumps(spec)]
    done = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, MS_ATB_QUIET="1"))
    if done.returncode != 0:
        raise SystemExit(f"bench_disk_cache.py: a run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _blocks(tokens: int, bs: int = 16) -> int:
    return -(-tokens // bs)


# ---- the scenarios ---------------------------------------------------------------------------------------------
def shared(args, tier_dir: str, bs: int) -> dict:
    prompts = workload(args)
    spec = dict(dir=tier_dir, max_model_len=max(map(len, prompts)) + args.output_len,
                num_blocks=_blocks(args.system_len, bs) + 2 * len(prompts) * _blocks(args.user[1] + args.output_len,
                                                                                       bs))
    runs = [run_child(args, **spec), run_child(args, **spec)]
    print(f"workload: {len(prompts)} requests, a {args.system_len}-token system prompt + {args.user[0]}-{args.user[1]} "
          f"tokens of their own; {args.output_len} output tokens each; pool {spec['num_blocks']} blocks (roomy); "
          f"one tier directory, two fresh processes\n")
    print("| run | prefill tokens computed | prompt tokens read from the tier | blocks written | TTFT of the first "
          "request s | elapsed s |")
    print("|---|---|---|---|---|---|")
    for i, r in enumerate(runs):
        print(f"| {i + 1} | {r['prefill_computed']:,} of {r['prompt_tokens']:,} | {r['disk_hit_tokens']:,} | "
              f"{r['disk_written_blocks']:,} | {r['ttft_first_s']:.3f} | {r['elapsed_s']:.1f} |")
    a, b = runs
    same = a["tokens"] == b["tokens"]
    print(f"\nsecond run's prefill / first's: {b['prefill_computed'] / a['prefill_computed']:.1%} (target <= 5%); "
          f"first request's TTFT second / first: {b['ttft_first_s'] / a['ttft_first_s']:.2f}; outputs identical: "
          f"{same}")
    return {"runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs], "identical": same}


def distinct(args, tier_dir: str, bs: int) -> dict:
    prompts = workload(args)
    running = args.max_num_seqs * _blocks(args.user[1] + args.output_len, bs)
    spec = dict(max_model_len=max(map(len, prompts)) + args.output_len,
                num_blocks=args.pool_prefixes * _blocks(args.prefix_len, bs) + running)
    runs = {"without the tier": run_child(args, dir=None, **spec),
            "with a fresh tier": run_child(args, dir=tier_dir, **spec)}
    print(f"workload: {args.prefixes} prefixes of {args.prefix_len} tokens x {args.per_prefix} requests, in rounds "
          f"(fcfs); + {args.user[0]}-{args.user[1]} tokens each, {args.output_len} output tokens; pool "
          f"{spec['num_blocks']} blocks: {args.pool_prefixes} prefixes + {args.max_num_seqs} running requests\n")
    print("| run | prefill tokens computed | prompt tokens read from the tier | preemptions | total s | CPU s |")
    print("|---|---|---|---|---|---|")
    for name, r in runs.items():
        print(f"| {name} | {r['prefill_computed']:,} of {r['prompt_tokens']:,} | {r['disk_hit_tokens']:,} | "
              f"{r['preemptions']} | {r['elapsed_s']:.1f} | {r['cpu_s']:.1f} |")
    a, b = runs.values()
    same = a["tokens"] == b["tokens"]
    print(f"\nwith / without: prefill {b['prefill_computed'] / a['prefill_computed']:.2f}x, total time "
          f"{b['elapsed_s'] / a['elapsed_s']:.2f}x; outputs identical: {same}")
    return {"runs": {k: {x: y for x, y in r.items() if x != "tokens"} for k, r in runs.items()}, "identical": same}


def noreuse(args, tier_dir: str, bs: int) -> dict:
    prompts = workload(args)
    spec = dict(max_model_len=max(map(len, prompts)) + args.output_len,
                num_blocks=2 * args.max_num_seqs * _blocks(max(map(len, prompts)) + args.output_len, bs))
    runs = {"without the tier": run_child(args, dir=None, **spec),
            "with a fresh tier": run_child(args, dir=tier_dir, **spec)}
    print(f"workload: {len(prompts)} requests of {args.system_len + args.user[0]}-{args.system_len + args.user[1]} "
          f"tokens sharing nothing, {args.output_len} output tokens each; pool {spec['num_blocks']} blocks\n")
    print("| run | output tok/s | elapsed s | CPU s | blocks written | flush after the run s |")
    print("|---|---|---|---|---|---|")
    for name, r in runs.items():
        print(f"| {name} | {r['output_tokens'] / r['elapsed_s']:.1f} | {r['elapsed_s']:.1f} | {r['cpu_s']:.1f} | "
              f"{r['disk_written_blocks']:,} | {r['flush_s']:.2f} |")
    a, b = runs.values()
    rate = [r["output_tokens"] / r["elapsed_s"] for r in (a, b)]
    print(f"\nthe tier's cost: output tok/s {1 - rate[1] / rate[0]:+.1%} slower (target <= 5%), CPU "
          f"{b['cpu_s'] / a['cpu_s'] - 1:+.1%}; outputs identical: {a['tokens'] == b['tokens']}")
    return {"runs": {k: {x: y for x, y in r.items() if x != "tokens"} for k, r in runs.items()}}


def readspeed_child(args, spec: dict) -> dict:
    """In the child: one prefill timed, its blocks written, then read back by a fresh tier and block manager."""
    from ms_atb import LLM, SamplingParams
    from ms_atb.config import parse_size
    from ms_atb.core.block_manager import BlockManager
    from ms_atb.worker.disk_tier import DiskTier
    llm = LLM(args.config, num_blocks=spec["num_blocks"], max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=spec["max_model_len"],
              cache_dtype=args.cache_dtype, precompile=True, disk_cache_dir=spec["dir"])
    prompt, bs = workload(args)[0], llm.config.kv_cache.block_size
    t0, c0 = time.perf_counter(), time.process_time()
    llm.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True), use_tqdm=False)
    prefill, prefill_cpu = time.perf_counter() - t0, time.process_time() - c0
    llm.flush_disk_cache()
    runner = llm.runner
    tier = DiskTier(spec["dir"], parse_size(llm.config.kv_cache.disk_cache_bytes, "disk_cache_bytes"),
                    runner.kv_identity(), bs, runner.kv_pool.block_bytes)
    bm = BlockManager(spec["num_blocks"], bs, enable_prefix_caching=True, tier=tier)
    t0, c0 = time.perf_counter(), time.process_time()
    bm.allocate("read", prompt)
    loads = bm.take_transfers()[0]
    tier.load_into(runner.kv_pool, loads)
    read, read_cpu = time.perf_counter() - t0, time.process_time() - c0
    blocks = len(prompt) // bs
    return {"blocks_read": len(loads), "read_s_per_block": read / len(loads),
            "read_cpu_s_per_block": read_cpu / len(loads),
            "prefill_s_per_block": prefill / blocks, "prefill_cpu_s_per_block": prefill_cpu / blocks,
            "block_bytes": runner.kv_pool.block_bytes, "file_bytes": os.path.getsize(tier.path(loads[0].hash))}


def readspeed(args, tier_dir: str, bs: int) -> dict:
    from ms_atb.sim.cost_model import ATLAS_800I_A2, LLAMA2_7B, THIS_CPU, CostModel
    from simulate_tier import block_lines
    r = run_child(args, dir=tier_dir, num_blocks=2 * _blocks(args.prefix_len, bs) + 8,
                  max_model_len=args.prefix_len + 16, readspeed=True)
    bandwidth = r["file_bytes"] / r["read_s_per_block"]
    print(f"a {args.prefix_len}-token prompt, {r['blocks_read']} blocks of {r['block_bytes']:,} bytes "
          f"({r['file_bytes']:,} with the header) read back from a warm page cache\n")
    print("| per block | wall ms | CPU ms |")
    print("|---|---|---|")
    print(f"| computed (the prefill's time / its blocks) | {r['prefill_s_per_block'] * 1e3:.2f} | "
          f"{r['prefill_cpu_s_per_block'] * 1e3:.2f} |")
    print(f"| read from the tier (open, read, MAC, CRC, tokens, copy into the pool) | "
          f"{r['read_s_per_block'] * 1e3:.2f} | {r['read_cpu_s_per_block'] * 1e3:.2f} |")
    print(f"\nreading is {r['prefill_s_per_block'] / r['read_s_per_block']:.0f}x faster than computing "
          f"({bandwidth / 1e9:.2f} GB/s through the tier's checks)")
    seven = CostModel(LLAMA2_7B, THIS_CPU).cost([16], [args.prefix_len], 0)
    block_7b = 16 * LLAMA2_7B.kv_bytes_per_token
    print(f"7B-shaped (simulated): one block of {LLAMA2_7B.name} fp16 is {block_7b / 2**20:g} MiB; on this CPU's "
          f"cost model computing it costs {seven.flops / THIS_CPU.peak_flops / THIS_CPU.efficiency:.2f} s of FLOPs, "
          f"reading it at the rate above {block_7b / bandwidth * 1e3:.1f} ms")
    print("\n".join(block_lines(CostModel(LLAMA2_7B, ATLAS_800I_A2), args.prefix_len)))
    return r


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        spec = json.loads(args.child)
        print(json.dumps(readspeed_child(args, spec) if spec.get("readspeed") else child(args, spec)))
        return 0
    from bench_kv import hardware
    from ms_atb.config import EngineConfig
    bs = EngineConfig.load(args.config).kv_cache.block_size
    print(f"hardware: {hardware()}; load average {os.getloadavg()[0]:.2f}")
    print(f"engine: {os.path.relpath(args.config, ROOT)}, cache dtype {args.cache_dtype}, max_num_seqs "
          f"{args.max_num_seqs}, max_num_batched_tokens {args.max_num_batched_tokens}; greedy, ignore_eos")
    with tempfile.TemporaryDirectory(prefix="ms_atb_kv_tier_") as tmp:
        tier_dir = args.dir or os.path.join(tmp, "tier")
        scenario = {"shared": shared, "distinct": distinct, "noreuse": noreuse, "readspeed": readspeed}[args.scenario]
        result = scenario(args, tier_dir, bs)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k not in ("child", "argv")}, "result": result},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
