"""Churn benchmark of the paged KV block manager.

Workload: 4,096 blocks of 16 tokens; prompt length and max_tokens each uniform in 16..1,024;
each request ends ("EOS") at a uniform random point in 1..max_tokens; new requests are
admitted while usage < 0.9; every running request appends one token per step; when a block
cannot be had, the newest running request is preempted (freed, back to the front of the
queue, resumed later with its prompt + generated tokens). Fixed seed, bounded steps.
Prints µs per call, allocation_contiguity, contiguity and mean usage for `contiguous` and
`scattered`, on the churn mix and two other length mixes, the churn figures' spread over
seeds (`--seeds`), a pool-size scaling line, and
MindFormers' BlockTables as a peer when its venv (.venv-mindformers) can run it.

    .venv/bin/python scripts/bench_block_manager.py [--steps N] [--seeds 40]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque

from script_args import require_at_least

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER_PYTHON = os.path.join(ROOT, ".venv-mindformers", "bin", "python")

# name -> (prompt range, max_tokens range) in tokens
MIXES = {
    "churn 16-1024/16-1024": ((16, 1024), (16, 1024)),
    "short-heavy 16-128/16-256": ((16, 128), (16, 256)),
    "long-heavy 512-2048/256-1024": ((512, 2048), (256, 1024)),
}

# name -> draw(rng) -> (prompt tokens, max_tokens): non-uniform shapes, to check that a placement policy
# is not tuned to the uniform mixes (scripts/research/placement_variants.py --shaped-mixes)
SHAPED_MIXES = {
    "bimodal prompts 16-64 | 768-1024, max_tokens 16-1024": lambda rng: (
        rng.randint(16, 64) if rng.random() < 0.5 else rng.randint(768, 1024), rng.randint(16, 1024)),
    "exponential prompts and max_tokens, mean 16 + 300, at most 1024": lambda rng: (
        min(1024, 16 + int(rng.expovariate(1 / 300))), min(1024, 16 + int(rng.expovariate(1 / 300)))),
    "max_tokens always 512, prompts 16-1024": lambda rng: (rng.randint(16, 1024), 512),
    "chat: prompts 200-400, max_tokens 16-2048": lambda rng: (rng.randint(200, 400), rng.randint(16, 2048)),
}


class NoBlocks(Exception):
    pass


class OursAdapter:
    def __init__(self, allocation: str, num_blocks: int, block_size: int, placement=None):
        # placement: a factory (num_blocks, block_size) -> placement, for the research placements
        from ms_atb.core.block_manager import BlockManager, NoFreeBlocksError
        self.bm = BlockManager(num_blocks, block_size, allocation=allocation, placement=placement)
        self.error = NoFreeBlocksError

    def allocate(self, rid, tokens, max_tokens):
        try:
            self.bm.allocate(rid, tokens, max_tokens)
        except self.error:
            raise NoBlocks from None

    def append(self, rid, token):
        try:
            self.bm.append_token(rid, token)
        except self.error:
            raise NoBlocks from None

    def free(self, rid):
        self.bm.free(rid)

    def usage(self):
        return self.bm.stats()["usage"]

    def contiguity(self):
        s = self.bm.stats()
        return s["allocation_contiguity"], s["contiguity"]


def run_workload(adapter, mix, steps: int, seed: int = 0, num_blocks: int = 4096,
                 block_size: int = 16, tell_end: bool = False) -> dict:
    """mix: ((prompt lo, hi), (max_tokens lo, hi)) in tokens, each uniform; or draw(rng) -> (prompt,
    max_tokens). tell_end: an oracle experiment. Each allocate gets max_tokens = 2 x the tokens the
    request will really still generate, so the manager's estimate (half the remaining max_tokens) is exact."""
    rng = random.Random(seed)
    waiting: deque = deque()
    running: dict = {}   # rid -> [tokens_so_far, generated, end_at, max_tokens]; insertion = admission
    next_id = 0
    t_alloc, t_append, t_free = [], [], []
    usage_sum, preemptions, finished = 0.0, 0, 0
    perf = time.perf_counter_ns

    def new_request():
        nonlocal next_id
        if callable(mix):
            prompt_len, max_tokens = mix(rng)
        else:
            (p_lo, p_hi), (m_lo, m_hi) = mix
            prompt_len, max_tokens = rng.randint(p_lo, p_hi), rng.randint(m_lo, m_hi)
        base = next_id * 4096
        next_id += 1
        return [f"r{next_id}", list(range(base, base + prompt_len)), 0, rng.randint(1, max_tokens), max_tokens]

    def release(rid):
        t0 = perf()
        adapter.free(rid)
        t_free.append(perf() - t0)
        del running[rid]

    for _ in range(steps):
        while adapter.usage() < 0.9:
            if not waiting:
                waiting.append(new_request())
            rid, tokens, gen, end_at, max_tokens = waiting[0]
            if len(tokens) > num_blocks * block_size:
                waiting.popleft()
                continue
            t0 = perf()
            try:
                adapter.allocate(rid, tokens, 2 * (end_at - gen) if tell_end else max_tokens - gen)
            except NoBlocks:
                break
            t_alloc.append(perf() - t0)
            waiting.popleft()
            running[rid] = [tokens, gen, end_at, max_tokens]
        for rid in list(running):
            if rid not in running:
                continue
            state = running[rid]
            while True:
                t0 = perf()
                try:
                    adapter.append(rid, 7)
                    t_append.append(perf() - t0)
                    break
                except NoBlocks:
                    newest = next(reversed(running))
                    tokens, gen, end_at, max_tokens = running[newest]
                    release(newest)
                    waiting.appendleft([newest, tokens, gen, end_at, max_tokens])
                    preemptions += 1
                    if newest == rid:
                        break
            if rid not in running:
                continue
            state[0].append(7)
            state[1] += 1
            if state[1] >= state[2]:
                release(rid)
                finished += 1
        usage_sum += adapter.usage()
    alloc_c, contig = adapter.contiguity()

    def us(xs):
        return (statistics.median(xs) / 1e3, statistics.fmean(xs) / 1e3) if xs else (float("nan"),) * 2
    return dict(allocate=us(t_alloc), append=us(t_append), free=us(t_free),
                allocation_contiguity=alloc_c, contiguity=contig, mean_usage=usage_sum / steps,
                allocations=len(t_alloc), finished=finished, preemptions=preemptions)


def format_row(name: str, r: dict) -> str:
    def c(x):
        return "  n/a" if x is None else f"{x:5.3f}"
    return (f"{name:<24} {r['allocate'][0]:7.2f}/{r['allocate'][1]:<7.2f} {r['append'][0]:6.2f}/{r['append'][1]:<6.2f}"
            f" {r['free'][0]:7.2f}/{r['free'][1]:<7.2f} {c(r['allocation_contiguity'])}     {c(r['contiguity'])}"
            f"  {r['mean_usage']:5.3f} {r['allocations']:6d} {r['preemptions']:6d}")


HEADER = (f"{'policy':<24} {'alloc µs med/mean':<16} {'append µs':<13} {'free µs':<15} "
          f"alloc_contig contig usage  allocs preempt")


def scaling_line() -> str:
    from ms_atb.core.block_manager import BlockManager
    out = []
    for n in (1_000, 100_000):
        bm = BlockManager(n, 16)
        live: set[str] = set()
        t0 = time.perf_counter()
        for i in range(2000):
            rid = f"q{i}"
            bm.allocate(rid, list(range(100)), 200)
            live.add(rid)
            for _ in range(40):
                bm.append_token(rid, 1)
            if i % 3:
                bm.free(rid)
                live.discard(rid)
            if bm.num_free_blocks < 40:
                for j in range(i + 1):
                    if f"q{j}" in live:
                        bm.free(f"q{j}")
                        live.discard(f"q{j}")
        out.append(f"{n} blocks: {(time.perf_counter() - t0) * 1e6 / 2000:.1f} µs per request")
    return "pool-size scaling (same work, allocate + 40 appends + free): " + "; ".join(out)


class MindFormersAdapter:
    """MindFormers' BlockTables pieces: one shared BlockMemPool, one CacheEngine per request."""

    def __init__(self, num_blocks: int, block_size: int):
        from mindformers.modules.cache_engine import BlockMemPool, CacheEngine
        self.pool, self.engine_cls, self.block_size = BlockMemPool(num_blocks, block_size), CacheEngine, block_size
        self.engines, self.num_blocks = {}, num_blocks
        self.multi = self.multi_ok = self.follow = self.follow_ok = 0

    def allocate(self, rid, tokens, max_tokens):
        engine = self.engine_cls(self.block_size, self.pool)
        try:
            engine.prepare_cache(len(tokens))
        except RuntimeError:  # 'block pool is out of memory', raised before any change
            raise NoBlocks from None
        self.engines[rid] = engine
        t = engine.block_table
        self.multi += len(t) >= 2
        self.multi_ok += len(t) >= 2 and all(t[i] == t[i - 1] + 1 for i in range(1, len(t)))
        self.follow += len(t) - 1
        self.follow_ok += sum(t[i] == t[i - 1] + 1 for i in range(1, len(t)))

    def append(self, rid, token):
        engine = self.engines[rid]
        n = len(engine.block_table)
        try:
            engine.prepare_cache(1)
        except RuntimeError:
            raise NoBlocks from None
        t = engine.block_table
        if len(t) > n:
            self.follow += 1
            self.follow_ok += t[-1] == t[-2] + 1

    def free(self, rid):
        self.engines.pop(rid).release_cache()

    def usage(self):
        return len(self.pool.used_blocks) / self.num_blocks

    def contiguity(self):
        return (self.multi_ok / self.multi if self.multi else 1.0,
                self.follow_ok / self.follow if self.follow else 1.0)


def run_peer_here(mix_name: str, steps: int) -> dict:
    import logging
    logging.disable(logging.CRITICAL)
    return run_workload(MindFormersAdapter(4096, 16), MIXES[mix_name], steps)


def peer_row(mix_name: str, steps: int) -> str:
    name = "MindFormers BlockTables"
    if not os.path.exists(PEER_PYTHON):
        return (f"{name}: not run: {PEER_PYTHON} is missing (python3 -m venv .venv-mindformers && "
                ".venv-mindformers/bin/pip install mindformers==1.9.0)")
    with tempfile.TemporaryDirectory() as tmp:  # mindformers writes ./output/log on import
        proc = subprocess.run([PEER_PYTHON, os.path.abspath(__file__), "--peer-only", mix_name, "--steps",
                               str(steps)], cwd=tmp, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return f"{name}: not run: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return format_row("MindFormers 1.9.0", r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4000, help="steps of the churn mix (other mixes: half)")
    ap.add_argument("--seeds", type=int, default=40,
                    help="also run the churn mix on seeds 0..N-1 with `contiguous` and print the spread (0: skip)")
    ap.add_argument("--peer-only", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    require_at_least(ap, args, 4, "steps", why=" (the other mixes run half as many)")
    if args.peer_only:
        print(json.dumps(run_peer_here(args.peer_only, args.steps)))
        return
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"hardware: {cpu}, {os.cpu_count()} cores; Python {platform.python_version()} ({platform.python_implementation()})")
    print("workload: 4096 blocks x 16 tokens; admit while usage < 0.9; one token per running request per step;"
          " newest preempted when no block; seed 0")
    for name, mix in MIXES.items():
        steps = args.steps if name.startswith("churn") else args.steps // 2
        print(f"\n== {name} (prompt/max_tokens tokens), {steps} steps ==")
        print(HEADER)
        for allocation in ("contiguous", "scattered"):
            r = run_workload(OursAdapter(allocation, 4096, 16), mix, steps)
            print(format_row(f"ms_atb {allocation}", r))
        print(peer_row(name, steps))
        if name.startswith("churn") and args.seeds > 1:
            print(seed_spread_line(mix, steps, args.seeds))
    print("\n" + scaling_line())


def seed_spread_line(mix, steps: int, seeds: int) -> str:
    """The churn figures of `contiguous` over seeds 0..seeds-1: seed 0 is one draw of the workload."""
    rs = [run_workload(OursAdapter("contiguous", 4096, 16), mix, steps, seed=seed) for seed in range(seeds)]
    alloc = [r["allocation_contiguity"] for r in rs]
    return (f"ms_atb contiguous over seeds 0-{seeds - 1}: allocation_contiguity mean {statistics.fmean(alloc):.3f}"
            f" (min {min(alloc):.3f}, max {max(alloc):.3f}; {sum(a >= 0.9 for a in alloc)} of {seeds} seeds >= 0.90),"
            f" contiguity mean {statistics.fmean(r['contiguity'] for r in rs):.3f}")


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main()
