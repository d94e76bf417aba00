"""Soak: many requests of random lengths through the tiny model on a small KV pool.

One engine (configs/tiny_llama.yaml, small step caps). The workload is token-id prompts of random
lengths, a share of them behind a few common prefixes and some exact duplicates; random max_tokens;
greedy, plus some sampled with a seed. It runs twice, in rounds of a few hundred requests:
  1. reference: a roomy pool (no preemption), prefix caching off, every request run to the end;
  2. soak: a small pool with prefix caching on, so requests are preempted and recomputed often, and
     some rounds run through generate_iter() and are abandoned after k results; the requests they
     left unfinished run again in the next round.
After every soak round: every block is free (cached-free blocks count as free), the block manager
tracks no request, the scheduler holds none (waiting and running empty). Every soak output equals
its reference token for token. Memory is flat: the resident set after the warm-up rounds and at the
end differ by less than RSS_BOUND_MIB. Exit status 1 on any failure.
    .venv/bin/python scripts/soak.py [--requests 20000] [--seed 0] [--small-blocks 32] [--quick]
"""
import argparse
import gc
import os
import platform
import sys
import time

import numpy as np

from script_args import require_at_least

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CONFIG = os.path.join(ROOT, "configs", "tiny_llama.yaml")
# Step caps of the one engine: few graphs to compile. The roomy pool holds max_num_seqs requests of
# max_model_len tokens, so the reference run never preempts.
ENGINE = dict(max_num_seqs=16, max_num_batched_tokens=128, max_model_len=256, num_blocks=256)
BLOCK_SIZE = 16                 # configs/tiny_llama.yaml
TOKEN_IDS = (1, 256)            # prompt ids: the byte range of the tiny model's 512-id vocabulary
PREFIX_SHARE = 0.4              # requests that start with one of the common prefixes
LONG_SHARE = 0.1               # prompts of up to max_model_len - max_tokens; the rest are < 97 tokens
DUPLICATE_SHARE = 0.05          # exact copies of an earlier request (prompt and parameters)
SAMPLED_SHARE = 0.15            # temperature 0.8 with a seed; the rest are greedy
ABANDON_SHARE = 0.25            # soak rounds run through generate_iter() and closed early
RSS_BOUND_MIB = 16.0            # allowed growth of the resident set from the warm-up to the end
WARMUP_ROUNDS = 3


def make_workload(num_requests: int, seed: int, max_model_len: int) -> list[tuple[list[int], dict]]:
    """(prompt token ids, SamplingParams keywords) per request; fixed by the seed."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(*TOKEN_IDS, int(n)).tolist() for n in rng.integers(16, 65, 4)]
    work = []
    for i in range(num_requests):
        if work and rng.random() < DUPLICATE_SHARE:
            work.append(work[int(rng.integers(len(work)))])
            continue
        max_tokens = int(rng.integers(1, 33))
        limit = max_model_len - max_tokens              # the longest prompt that fits
        prompt_len = int(rng.integers(1, limit + 1 if rng.random() < LONG_SHARE else min(limit + 1, 97)))
        prompt = rng.integers(*TOKEN_IDS, prompt_len).tolist()
        if rng.random() < PREFIX_SHARE:
            prompt = (prefixes[int(rng.integers(len(prefixes)))] + prompt[:prompt_len // 2 + 1])[:limit]
        params = dict(max_tokens=max_tokens, temperature=0.0, ignore_eos=bool(rng.random() < 0.5))
        if rng.random() < SAMPLED_SHARE:
            params.update(temperature=0.8, top_p=0.95, seed=int(rng.integers(2**31)))
        work.append((prompt, params))
    return work


def rss_mib() -> float:
    """The resident set of this process (/proc/self/statm), MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def held(llm) -> list[str]:
    """What the engine still holds between rounds: blocks owned by a request, requests in the
    scheduler or the block manager. Empty when the engine is idle and clean."""
    sched = llm.scheduler
    bm, s = sched.block_manager, sched.block_manager.stats()
    out = []
    if bm.num_free_blocks != bm.num_blocks:
        out.append(f"{bm.num_blocks - bm.num_free_blocks} of {bm.num_blocks} blocks are not free")
    if s["num_requests"]:
        out.append(f"the block manager tracks {s['num_requests']} requests")
    if sched.waiting or sched.running:
        out.append(f"the scheduler holds {len(sched.waiting)} waiting and {len(sched.running)} running")
    return out


def run_round(llm, work, ids: list[int], tag: str, stop_after: int | None) -> tuple[dict, list[int]]:
    """Runs the requests work[i] for i in ids; with stop_after, closes generate_iter() after that
    many results. Returns ({i: output token ids}, the ids left unfinished)."""
    from ms_atb import SamplingParams
    requests = [llm.make_request(work[i][0], SamplingParams(**work[i][1]), index=k, request_id=f"{tag}-{i}")
                for k, i in enumerate(ids)]
    done = {}
    results = llm.generate_iter(requests, use_tqdm=False)
    for k, out in results:
        done[ids[k]] = out.token_ids
        if stop_after is not None and len(done) >= stop_after:
            break
    results.close()
    return done, [i for i in ids if i not in done]


def run_reference(llm, work, round_size: int, roomy_blocks: int, log=print) -> list[tuple[int, ...]]:
    """Every request's output on a roomy pool without prefix caching, rounds run to the end."""
    llm.reset_scheduler(num_blocks=roomy_blocks, enable_prefix_caching=False)
    ref: list = [None] * len(work)
    t0 = time.perf_counter()
    for n, start in enumerate(range(0, len(work), round_size), 1):
        done, left = run_round(llm, work, list(range(start, min(start + round_size, len(work)))), "ref", None)
        assert not left
        for i, tokens in done.items():
            ref[i] = tuple(tokens)
        if log and n % 10 == 0:
            log(f"  reference round {n}: {start + len(done)} requests, {time.perf_counter() - t0:.0f} s")
    assert llm.scheduler.num_preemptions == 0, "the roomy pool preempted: it is not roomy"
    return ref


def run_soak(llm, work, ref, round_size: int, small_blocks: int, seed: int, log=print) -> dict:
    """The soak phase; returns its figures, with "failures" (empty on a pass)."""
    llm.reset_scheduler(num_blocks=small_blocks, enable_prefix_caching=True)
    rng = np.random.default_rng([seed, 1])
    failures, rss = [], []
    figures = dict(requests=0, rounds=0, abandoned_rounds=0, cancelled=0, mismatches=0)
    carry: list[int] = []                      # unfinished requests of an abandoned round
    start, t0 = 0, time.perf_counter()
    while start < len(work) or carry:
        ids = carry + list(range(start, min(start + round_size, len(work))))
        start += len(ids) - len(carry)
        abandon = len(ids) > 1 and (figures["rounds"] == 1 or rng.random() < ABANDON_SHARE)
        stop_after = int(rng.integers(1, len(ids))) if abandon else None
        done, carry = run_round(llm, work, ids, f"soak{figures['rounds']}", stop_after)
        figures["rounds"] += 1
        figures["abandoned_rounds"] += abandon
        figures["cancelled"] += len(carry)
        figures["requests"] += len(done)
        for i, tokens in done.items():
            if tuple(tokens) != ref[i]:
                figures["mismatches"] += 1
                if figures["mismatches"] <= 5:
                    failures.append(f"request {i} ({work[i][1]}): {list(tokens)} != reference {list(ref[i])}")
        problems = held(llm)
        if problems:
            failures.append(f"after round {figures['rounds']}: " + "; ".join(problems))
        gc.collect()
        rss.append(rss_mib())
        if log and figures["rounds"] % 10 == 0:
            log(f"  round {figures['rounds']}: {figures['requests']} requests, {figures['mismatches']} mismatches, "
                f"{len(failures)} failures, {llm.scheduler.num_preemptions} preemptions, RSS {rss[-1]:.1f} MiB, "
                f"{time.perf_counter() - t0:.0f} s")
    s = llm.stats()
    warm = rss[min(WARMUP_ROUNDS, len(rss)) - 1]
    figures.update(preemptions=s["num_preemptions"], prefix_hit_rate=s["prefix_cache_hit_rate"],
                   prefix_hits=s["prefix_cache_hits"], evictions=s["evictions"],
                   rss_warm_mib=warm, rss_end_mib=rss[-1], rss_max_mib=max(rss[WARMUP_ROUNDS - 1:] or rss),
                   wall_s=time.perf_counter() - t0)
    if figures["mismatches"]:
        failures.append(f"{figures['mismatches']} outputs differ from the roomy-pool reference")
    if figures["rss_end_mib"] - warm >= RSS_BOUND_MIB:
        failures.append(f"RSS grew {figures['rss_end_mib'] - warm:.1f} MiB after the warm-up "
                        f"(bound {RSS_BOUND_MIB} MiB)")
    if figures["preemptions"] == 0:
        failures.append(f"no preemption on {small_blocks} blocks: the pool is not small enough")
    figures["failures"] = failures
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--small-blocks", type=int, default=32,
                    help="KV blocks of the soak pool (the roomy reference pool has %d)" % ENGINE["num_blocks"])
    ap.add_argument("--round-size", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="300 requests in rounds of 50 (a smoke run)")
    args = ap.parse_args()
    require_at_least(ap, args, 1, "requests", "round_size")
    require_at_least(ap, args, 0, "seed")
    need = -(-(ENGINE["max_model_len"] - 1) // BLOCK_SIZE)
    require_at_least(ap, args, need, "small_blocks", why=f" (one request of max_model_len {ENGINE['max_model_len']})")
    if args.small_blocks > ENGINE["num_blocks"]:
        ap.error(f"--small-blocks must be <= {ENGINE['num_blocks']} (the pool built), got {args.small_blocks}")
    if args.quick:
        args.requests, args.round_size = 300, 50

    import mindspore
    from ms_atb import LLM
    t0 = time.perf_counter()
    llm = LLM(CONFIG, **ENGINE)
    work = make_workload(args.requests, args.seed, ENGINE["max_model_len"])
    print(f"workload: {args.requests} requests, seed {args.seed}, rounds of {args.round_size}; engine {ENGINE}, "
          f"soak pool {args.small_blocks} blocks of {BLOCK_SIZE}; built in {llm.build_seconds:.1f} s", flush=True)
    t_ref = time.perf_counter()
    ref = run_reference(llm, work, args.round_size, ENGINE["num_blocks"], log=lambda m: print(m, flush=True))
    t_ref = time.perf_counter() - t_ref
    print(f"reference (roomy pool, no prefix caching): {t_ref:.1f} s", flush=True)
    f = run_soak(llm, work, ref, args.round_size, args.small_blocks, args.seed,
                 log=lambda m: print(m, flush=True))
    print(f"python {platform.python_version()}, mindspore {mindspore.__version__}, {os.cpu_count()} CPUs")
    print(f"requests {f['requests']} (+{f['cancelled']} cancelled and re-run), rounds {f['rounds']} "
          f"({f['abandoned_rounds']} abandoned mid-run)")
    print(f"preemptions {f['preemptions']}, prefix hit rate {f['prefix_hit_rate']:.3f} "
          f"({f['prefix_hits']} block hits), evictions {f['evictions']}")
    print(f"outputs equal to the reference: {f['requests'] - f['mismatches']} of {f['requests']}")
    print(f"RSS after {WARMUP_ROUNDS} warm-up rounds {f['rss_warm_mib']:.1f} MiB, end {f['rss_end_mib']:.1f} MiB, "
          f"max {f['rss_max_mib']:.1f} MiB (bound +{RSS_BOUND_MIB} MiB)")
    print(f"wall: soak {f['wall_s']:.1f} s, reference {t_ref:.1f} s, total {time.perf_counter() - t0:.1f} s")
    for line in f["failures"]:
        print("FAIL:", line)
    print("FAIL" if f["failures"] else "PASS")
    return 1 if f["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
