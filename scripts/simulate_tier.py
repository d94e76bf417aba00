"""A KV tier beside the card's pool, estimated on the Atlas 800I A2 (Llama2-7B fp16, the setting of
scripts/simulate.py): a workload whose prefixes exceed the card's KV budget, run with paged + prefix caching
alone and with host DRAM or an NVMe SSD keeping the blocks the card computed (ms_atb/sim/kv_tier.py), and what a
block costs to read back against computing it. Every assumption is printed with its source.

    python scripts/simulate_tier.py                   # 48 prefixes of 2,000 tokens, 4 requests each (~20 s)
    python scripts/simulate_tier.py --prefixes 16     # prefixes that fit the card: the tier adds nothing
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

from ms_atb.sim.cost_model import ATLAS_800I_A2, LLAMA2_7B, CostModel, GiB, MiB
from ms_atb.sim.kv_tier import HOST_DRAM, NVME_SSD, SimTier
from ms_atb.sim.simulator import simulate, ttft_one_by_one
from script_args import require_at_least

MAX_MODEL_LEN, BLOCK_SIZE, STATIC_SLOTS = 4096, 16, 12
TIERS = {"none": None, "dram": HOST_DRAM, "ssd": NVME_SSD}
LABELS = {"none": "paged + prefix caching", "dram": "  + host DRAM tier", "ssd": "  + NVMe SSD tier"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefixes", type=int, default=48, help="distinct system prompts (few-shot prompts)")
    p.add_argument("--per-prefix", type=int, default=4, help="requests sharing each one")
    p.add_argument("--prefix-len", type=int, default=2000)
    p.add_argument("--user-len", type=int, default=64, help="mean user-message tokens (uniform 1..2x-1)")
    p.add_argument("--output-len", type=int, default=128, help="mean output tokens (uniform x/2..3x/2)")
    p.add_argument("--kv-budget-gib", type=float, default=None,
                   help="the card's KV budget (default: the article's static row, 12 x 4,096 tokens = 24 GiB)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--tiers", default="none,dram,ssd", help="comma-separated: none, dram, ssd")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    require_at_least(p, args, 1, "prefixes", "per_prefix", "prefix_len", "user_len", "max_num_seqs",
                     "max_num_batched_tokens")
    require_at_least(p, args, 2, "output_len")
    if args.kv_budget_gib is not None and not args.kv_budget_gib > 0:
        p.error(f"--kv-budget-gib must be > 0, got {args.kv_budget_gib}")
    args.tiers = args.tiers.split(",")
    if any(t not in TIERS for t in args.tiers):
        p.error(f"--tiers: each must be one of {list(TIERS)}, got {','.join(args.tiers)!r}")
    if args.prefix_len + 2 * args.user_len - 1 + args.output_len * 3 // 2 > MAX_MODEL_LEN:
        p.error(f"the longest request exceeds max_model_len {MAX_MODEL_LEN}: shorten --prefix-len, --user-len or "
                f"--output-len")
    return args


def grouped_requests(args, vocab_size: int) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens): prefix k's requests arrive in rounds (prefix 0, 1, ..., P-1, then 0, 1, ... again),
    so a prefix comes back after every other prefix has passed through the pool."""
    rng = random.Random(args.seed)
    prefixes = [[rng.randrange(vocab_size) for _ in range(args.prefix_len)] for _ in range(args.prefixes)]
    out = []
    for _ in range(args.per_prefix):
        for prefix in prefixes:
            user = [rng.randrange(vocab_size) for _ in range(rng.randint(1, 2 * args.user_len - 1))]
            out.append((prefix + user, rng.randint(args.output_len // 2, args.output_len * 3 // 2)))
    return out


def block_lines(cm: CostModel, prefix_len: int) -> list[str]:
    """One block of Llama2-7B: its bytes, computing it at the end of a prefix_len-token prefill, reading it back."""
    block_bytes = BLOCK_SIZE * LLAMA2_7B.kv_bytes_per_token
    ctx = prefix_len
    compute = cm.cost([BLOCK_SIZE], [ctx], 0)
    # a block within a long prefill shares the step's weight reads: its own FLOPs at the compute roofline
    own = compute.flops / cm.device.peak_flops / cm.device.efficiency
    lines = [f"One block of {BLOCK_SIZE} tokens of {LLAMA2_7B.name} fp16: {block_bytes / MiB:g} MiB of KV. "
             f"Computing it at tokens {ctx - BLOCK_SIZE}..{ctx} of a prefill: {own * 1e3:.2f} ms of the card's "
             f"compute ({compute.flops / 1e12:.2f} TFLOP at {cm.device.peak_flops / 1e12:g} TFLOP/s x "
             f"{cm.device.efficiency:g}; {compute.seconds * 1e3:.1f} ms as a step of its own, weights read once)."]
    for device in (HOST_DRAM, NVME_SSD):
        read = block_bytes / device.read_bandwidth
        lines.append(f"  read back from {device.name}: {read * 1e3:.2f} ms ({device.read_bandwidth / 1e9:.1f} GB/s) "
                     f"= {read / own:.2f}x computing it")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    cm = CostModel(LLAMA2_7B, ATLAS_800I_A2)
    budget = (args.kv_budget_gib * GiB if args.kv_budget_gib is not None
              else STATIC_SLOTS * MAX_MODEL_LEN * LLAMA2_7B.kv_bytes_per_token)
    block_bytes = BLOCK_SIZE * LLAMA2_7B.kv_bytes_per_token
    num_blocks = int(budget // block_bytes)
    longest = args.prefix_len + 2 * args.user_len - 1 + args.output_len * 3 // 2
    if -(-(longest - 1) // BLOCK_SIZE) > num_blocks:
        print(f"simulate_tier.py: error: the longest request ({longest} tokens) needs more than the card's {num_blocks} "
              f"blocks: raise --kv-budget-gib or shorten the requests", file=sys.stderr)
        return 2
    requests = grouped_requests(args, LLAMA2_7B.vocab_size)
    prefix_blocks = args.prefixes * (args.prefix_len // BLOCK_SIZE)
    print(f"# A KV tier beside the pool: {LLAMA2_7B.name} fp16 on {ATLAS_800I_A2.name} (simulated)")
    print(f"  device: {ATLAS_800I_A2.source}")
    for name in args.tiers:
        if TIERS[name] is not None:
            print(f"  {TIERS[name].name}: {TIERS[name].source}")
    print(f"  KV budget {budget / GiB:g} GiB = {num_blocks} blocks of {BLOCK_SIZE} tokens ({block_bytes / MiB:g} MiB "
          f"each); the workload's prefixes hold {prefix_blocks} blocks ({prefix_blocks / num_blocks:.1f}x the card)")
    print(f"  workload: {len(requests)} requests at t=0: {args.prefixes} prefixes of {args.prefix_len} tokens, "
          f"{args.per_prefix} requests each, arriving in rounds (every prefix once, then again); user message "
          f"1..{2 * args.user_len - 1} tokens, output {args.output_len // 2}..{args.output_len * 3 // 2}; fcfs, "
          f"chunked prefill, max_num_seqs {args.max_num_seqs}, max_num_batched_tokens {args.max_num_batched_tokens}")
    print("  a block read back costs bytes / the tier's bandwidth on the step that loads it (not overlapped); "
          "blocks written to the tier are not charged (copied out behind later steps)")
    print()
    print("| configuration | requests/s | concurrency | TTFT p50 s | TTFT p90 s | TTFT of a returning prefix ms | "
          "prompt tokens computed | read from the tier | output tok/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.tiers:
        tier = lambda: None if TIERS[name] is None else SimTier(TIERS[name], block_bytes, BLOCK_SIZE)  # noqa: E731
        r = simulate(cm, requests, "prefix", num_blocks, BLOCK_SIZE, MAX_MODEL_LEN, args.max_num_seqs,
                     args.max_num_batched_tokens, tier())
        # one by one: every prefix once, then prefix 0 again (evicted from the card when the prefixes exceed it)
        alone = requests[:args.prefixes] + [requests[args.prefixes % len(requests)]]
        back = ttft_one_by_one(cm, alone, "prefix", num_blocks, BLOCK_SIZE, MAX_MODEL_LEN,
                               args.max_num_batched_tokens, tier())[-1]
        ttft = sorted(r.ttft)
        print(f"| {LABELS[name]} | {r.num_requests / r.sim_seconds:.2f} | {r.sustained_running:.1f} | "
              f"{statistics.median(ttft):.2f} | {ttft[int(0.9 * (len(ttft) - 1))]:.2f} | {back * 1e3:.0f} | "
              f"{r.prompt_tokens_computed:,} | {r.tier_tokens_read:,} | {r.output_tokens_per_s:.0f} |")
    print()
    print("\n".join(block_lines(cm, args.prefix_len)))
    print(f"\n(simulated in {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
