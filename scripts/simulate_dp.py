"""Data parallelism on the Atlas 800I A2, estimated: one offline batch split over D independent replicas by
ms-atb-generate's own rule (ms_atb/batch/replicas.py: balanced by prompt tokens), each replica simulated on one
card with the cost model of scripts/simulate.py's llama2-7b-atlas setting; the job ends with its slowest replica.

    python scripts/simulate_dp.py                     # 640 requests sharing a 1,000-token system prompt
    python scripts/simulate_dp.py --shared-fraction 0 --replicas 1,2,4
"""
from __future__ import annotations

import argparse
import sys

from ms_atb.batch.replicas import split
from ms_atb.sim.cost_model import ATLAS_800I_A2, LLAMA2_7B, CostModel
from ms_atb.sim.simulator import Workload, output_len_for_static_utilisation, simulate
from script_args import require_at_least

MAX_MODEL_LEN, BLOCK_SIZE = 4096, 16
STATIC_UTILISATION = 0.45          # the article's static row: it sets the outputs' length, as simulate.py does


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=640)
    p.add_argument("--replicas", default="1,2,4,8", help="comma-separated replica (card) counts")
    p.add_argument("--prefix-len", type=int, default=1000)
    p.add_argument("--shared-fraction", type=float, default=1.0, help="requests that share the system prompt")
    p.add_argument("--user-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    require_at_least(p, args, 1, "requests", "prefix_len", "user_len")
    try:
        args.replicas = [int(x) for x in args.replicas.split(",")]
    except ValueError:
        p.error(f"--replicas takes comma-separated integers, got {args.replicas!r}")
    if min(args.replicas) < 1:
        p.error(f"--replicas must be >= 1 each, got {args.replicas}")
    if not 0.0 <= args.shared_fraction <= 1.0:
        p.error(f"--shared-fraction must lie in [0, 1], got {args.shared_fraction}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    budget = 12 * MAX_MODEL_LEN * LLAMA2_7B.kv_bytes_per_token          # simulate.py's default KV budget per card
    num_blocks = int(budget // (BLOCK_SIZE * LLAMA2_7B.kv_bytes_per_token))
    out_len = output_len_for_static_utilisation(STATIC_UTILISATION, MAX_MODEL_LEN, args.prefix_len, args.user_len)
    requests = Workload(args.requests, args.prefix_len, args.shared_fraction, args.user_len, out_len,
                        LLAMA2_7B.vocab_size, args.seed).requests()
    cost = CostModel(LLAMA2_7B, ATLAS_800I_A2)
    print(f"Llama2-7B fp16, one Atlas 800I A2 card per replica; {args.requests} requests, {args.prefix_len}-token "
          f"system prompt shared by {args.shared_fraction:.0%}, outputs {out_len // 2}-{out_len * 3 // 2} tokens; "
          f"paged + prefix caching, {num_blocks} blocks of {BLOCK_SIZE} per card")
    print("| replicas (cards) | job s | output tok/s | speed-up | slowest / fastest replica |")
    print("|---|---|---|---|---|")
    base = None
    for d in args.replicas:
        shares = split([len(prompt) for prompt, _ in requests], d)
        runs = [simulate(cost, [requests[i] for i in share], "prefix", num_blocks, BLOCK_SIZE, MAX_MODEL_LEN)
                for share in shares if share]
        job = max(r.sim_seconds for r in runs)
        rate = sum(r.output_tokens for r in runs) / job
        base = base or rate
        print(f"| {d} | {job:.0f} | {rate:,.0f} | {rate / base:.2f}x | "
              f"{job / min(r.sim_seconds for r in runs):.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
