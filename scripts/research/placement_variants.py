"""Runs the placement variants of scripts/research/placement_catalogue.py on the churn benchmark.

    .venv/bin/python scripts/research/placement_variants.py [--seeds 0-5] [--steps 4000] [--only a,b]
    .venv/bin/python scripts/research/placement_variants.py --pools     # kept vs the near-fit baseline on other pools
    .venv/bin/python scripts/research/placement_variants.py --shaped-mixes --seeds 0-19   # ... on non-uniform mixes

Prints, per variant and mix, allocation_contiguity per seed, the mean and the mean contiguity.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, HERE)

from bench_block_manager import MIXES, SHAPED_MIXES, OursAdapter, run_workload  # noqa: E402
from placement_catalogue import VARIANTS  # noqa: E402
from script_args import require_at_least, seed_range  # noqa: E402


def run_variant(name: str, mix_name: str, steps: int, seed: int) -> dict:
    cls, tell_end = VARIANTS[name]
    return run_workload(OursAdapter("contiguous", 4096, 16, placement=cls), MIXES[mix_name], steps,
                        seed=seed, tell_end=tell_end)


# (num_blocks, block_size, prompt and max_tokens range in tokens): the churn mix on other pools
POOLS = [(2048, 16, (16, 1024)), (8192, 16, (16, 1024)), (4096, 32, (32, 2048)), (4096, 16, (16, 2048))]


def pool_table(names: list[str], seeds: list[int], steps: int) -> None:
    print(f"\n== the churn workload on other pools (uniform prompt and max_tokens), {steps} steps ==")
    for num_blocks, block_size, lengths in POOLS:
        for name in names:
            cls, tell_end = VARIANTS[name]
            rs = [run_workload(OursAdapter("contiguous", num_blocks, block_size, placement=cls),
                               (lengths, lengths), steps, seed=seed, num_blocks=num_blocks,
                               block_size=block_size, tell_end=tell_end) for seed in seeds]
            mean_alloc = statistics.fmean(r["allocation_contiguity"] for r in rs)
            mean_contig = statistics.fmean(r["contiguity"] for r in rs)
            print(f"{num_blocks} x {block_size}, {lengths[0]}-{lengths[1]} tokens  {name:<30} mean {mean_alloc:.3f}"
                  f"  seed {seeds[0]} {rs[0]['allocation_contiguity']:.3f}  contiguity {mean_contig:.3f}")


def shaped_table(names: list[str], seeds: list[int], steps: int) -> None:
    """Each policy on bench_block_manager's non-uniform mixes: mean, and the paired difference to the first."""
    print(f"\n== non-uniform length mixes, 4096 x 16, {steps} steps, seeds {seeds[0]}-{seeds[-1]} ==")
    for mix_name, draw in SHAPED_MIXES.items():
        base = None
        for name in names:
            cls, tell_end = VARIANTS[name]
            rs = [run_workload(OursAdapter("contiguous", 4096, 16, placement=cls), draw, steps, seed=seed,
                               tell_end=tell_end) for seed in seeds]
            allocs = [r["allocation_contiguity"] for r in rs]
            line = (f"{mix_name:<66} {name:<22} mean {statistics.fmean(allocs):.3f}"
                    f"  contiguity {statistics.fmean(r['contiguity'] for r in rs):.3f}")
            if base is None:
                base = allocs
            elif len(seeds) > 1:
                d = [a - b for a, b in zip(allocs, base)]
                line += f"  vs {names[0]}: {statistics.fmean(d):+.4f} ± {statistics.stdev(d) / len(d) ** 0.5:.4f}"
            print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-5", help="seed range, e.g. 0-5 (default) or 3")
    ap.add_argument("--steps", type=int, default=4000, help="steps of the churn mix (other mixes: half)")
    ap.add_argument("--only", default=None, help="comma-separated variant names (default: all)")
    ap.add_argument("--pools", action="store_true",
                    help="instead: the kept placement and the near-fit baseline on other pool sizes and length ranges")
    ap.add_argument("--shaped-mixes", action="store_true",
                    help="instead: the near-fit baseline and the kept placement on non-uniform length mixes")
    args = ap.parse_args()
    names = list(VARIANTS) if args.only is None else [n.strip() for n in args.only.split(",")]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    seeds = seed_range(ap, args.seeds)
    require_at_least(ap, args, 4, "steps", why=" (the other mixes run half as many)")
    if args.shaped_mixes:
        shaped_table(names if args.only else ["near-fit baseline", "kept policy"], seeds, 3000)
        return
    if args.pools:
        pool_table(names if args.only else ["kept policy", "near-fit baseline"], seeds, args.steps)
        return
    print(f"allocation_contiguity per seed {seeds[0]}..{seeds[-1]}, mean, and mean contiguity")
    for mix_name in MIXES:
        steps = args.steps if mix_name.startswith("churn") else args.steps // 2
        print(f"\n== {mix_name}, {steps} steps ==")
        for name in names:
            rs = [run_variant(name, mix_name, steps, seed) for seed in seeds]
            per_seed = " ".join(f"{r['allocation_contiguity']:.3f}" for r in rs)
            print(f"{name:<28} {per_seed}  mean {statistics.fmean(r['allocation_contiguity'] for r in rs):.3f}"
                  f"  contiguity {statistics.fmean(r['contiguity'] for r in rs):.3f}")


if __name__ == "__main__":
    main()
