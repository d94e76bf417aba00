"""Admission order on a prefix-heavy batch: scheduler.policy fcfs vs prefix, on one engine.

The workload: `--systems` distinct system prompts of about `--system-len` tokens, `--turns` user turns
each (`--user` LO-HI tokens), shuffled, then `--duplicates` of them repeated exactly (same prompt, same
greedy parameters) at random places; random token ids, greedy, ignore_eos, outputs `--output` LO-HI tokens.
The KV pool holds about three system prompts' blocks plus the running requests' own blocks (`--num-blocks`
0: 3 x blocks of a system prompt + max_num_seqs x blocks of the longest user turn and output), so FCFS
evicts a system prompt before the next request that shares it arrives. Printed per policy: output tok/s
(tokens delivered, a duplicate's copied tokens included, over the wall time of generate()), the block
manager's prefix hit rate, prefill tokens computed (tokens fed to the model less one per output token after
the first of every computed request; a recompute after preemption counts), and the share of what an
oracle with an infinite cache skips (every prompt token less the distinct prefixes of all prompts) that
the run skipped. Both policies must give every request the same tokens; the script checks it.
    .venv/bin/python scripts/bench_prefix_order.py                                     # tiny model, minutes
    .venv/bin/python scripts/bench_prefix_order.py --config configs/smollm2_135m.yaml
"""
import argparse
import json
import os
import random
import time

from bench_kv import hardware
from script_args import require_at_least, writable_output

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
POLICIES = ("fcfs", "prefix")


def make_workload(seed: int, systems: int, system_len: int, turns: int, user: tuple, output: tuple,
                  duplicates: int, vocab: int) -> tuple[list[list[int]], list[int], list[bool]]:
    """(prompts, max_tokens, is_duplicate): systems x turns prompts, shuffled, with `duplicates` exact
    repeats of earlier ones inserted after them. Token ids avoid the low ids that tokenizers reserve."""
    rng = random.Random(seed)
    lo, hi = (100, min(vocab, 49000)) if vocab > 1000 else (1, min(vocab, 256))

    def ids(n):
        return [rng.randrange(lo, hi) for _ in range(n)]
    system_prompts = [ids(rng.randint(system_len - system_len // 25, system_len + system_len // 25))
                      for _ in range(systems)]
    requests = [(s + ids(rng.randint(*user)), rng.randint(*output)) for s in system_prompts for _ in range(turns)]
    rng.shuffle(requests)
    marked = [(p, m, False) for p, m in requests]
    for _ in range(duplicates):
        i = rng.randrange(len(requests))
        p, m = requests[i]
        j = rng.randint(marked.index((p, m, False)) + 1, len(marked))
        marked.insert(j, (p, m, True))
    return [p for p, _, _ in marked], [m for _, m, _ in marked], [d for _, _, d in marked]


def distinct_prefix_tokens(prompts: list[list[int]]) -> int:
    """Tokens in the trie of all prompts: what an infinite cache computes once (sorted order: each prompt
    adds what it does not share with the one before it)."""
    unique = sorted(set(map(tuple, prompts)))
    total, prev = 0, ()
    for p in unique:
        shared = 0
        while shared < min(len(p), len(prev)) and p[shared] == prev[shared]:
            shared += 1
        total += len(p) - shared
        prev = p
    return total


def run_policy(llm, policy, prompts, max_tokens, duplicate, num_blocks) -> tuple[dict, list[list[int]]]:
    from ms_atb import SamplingParams
    llm.reset_scheduler(policy=policy, num_blocks=num_blocks)
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in max_tokens]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    s = llm.stats()
    assert [len(o.token_ids) for o in outputs] == max_tokens
    computed = [m for m, d in zip(max_tokens, duplicate) if policy == "fcfs" or not d]
    assert len(max_tokens) - len(computed) == s["num_deduplicated"]
    prefill = s["num_computed_tokens"] - sum(m - 1 for m in computed)
    return {"output_tok_s": sum(max_tokens) / elapsed, "elapsed_s": elapsed, "prefill_computed": prefill,
            "prefix_hit_rate": s["prefix_cache_hit_rate"], "preemptions": s["num_preemptions"],
            "evictions": s["evictions"], "deduplicated": s["num_deduplicated"]}, [o.token_ids for o in outputs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "tiny_llama.yaml"))
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-num-batched-tokens", type=int, default=256)
    ap.add_argument("--num-blocks", type=int, default=0, help="0: three system prompts + the running requests")
    ap.add_argument("--systems", type=int, default=8)
    ap.add_argument("--system-len", type=int, default=500)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--user", type=int, nargs=2, default=[32, 160], metavar=("LO", "HI"))
    ap.add_argument("--output", type=int, nargs=2, default=[16, 64], metavar=("LO", "HI"))
    ap.add_argument("--duplicates", type=int, default=-1, help="exact repeats (-1: 10%% of the batch)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each policy, alternating (fcfs prefix, prefix fcfs); the best of each is printed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=os.path.join(ROOT, "out", "bench_prefix_order.json"))
    args = ap.parse_args()
    require_at_least(ap, args, 1, "max_model_len", "max_num_seqs", "max_num_batched_tokens", "systems",
                     "system_len", "turns", "repeats")
    require_at_least(ap, args, 0, "num_blocks")
    require_at_least(ap, args, -1, "duplicates")
    for name in ("user", "output"):
        lo, hi = getattr(args, name)
        if not 1 <= lo <= hi:
            ap.error(f"--{name} LO HI needs 1 <= LO <= HI, got {lo} {hi}")
    writable_output(ap, args.json, "--json")
    duplicates = args.systems * args.turns // 9 if args.duplicates < 0 else args.duplicates   # ~10% of all

    from ms_atb import LLM
    from ms_atb.config import EngineConfig
    bs = EngineConfig.load(args.config).kv_cache.block_size
    num_blocks = args.num_blocks or (3 * -(-args.system_len // bs) +
                                     args.max_num_seqs * -(-(args.user[1] + args.output[1]) // bs))
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    llm = LLM(args.config, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, num_blocks=num_blocks,
              precompile=True)      # every graph before any clock starts: both policies run on compiled graphs
    build_s = time.perf_counter() - t0
    prompts, max_tokens, duplicate = make_workload(args.seed, args.systems, args.system_len, args.turns,
                                                   tuple(args.user), tuple(args.output), duplicates,
                                                   llm.model_config.vocab_size)
    from ms_atb import SamplingParams
    llm.generate([prompts[0][:64]], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)  # one-time costs
    total = sum(map(len, prompts))
    oracle_skip = total - distinct_prefix_tokens(prompts)
    print(f"hardware: {hardware()}; load average at start {load0:.2f}")
    print(f"engine: {os.path.relpath(args.config, ROOT)}, built in {build_s:.0f} s; max_model_len "
          f"{args.max_model_len}, max_num_seqs {args.max_num_seqs}, max_num_batched_tokens "
          f"{args.max_num_batched_tokens}; KV pool {num_blocks} blocks x {bs} tokens (3 system prompts of "
          f"{-(-args.system_len // bs)} blocks + {args.max_num_seqs} running x "
          f"{-(-(args.user[1] + args.output[1]) // bs)})")
    print(f"workload (seed {args.seed}): {args.systems} system prompts of ~{args.system_len} tokens x "
          f"{args.turns} user turns of {args.user[0]}-{args.user[1]} tokens, shuffled, + {duplicates} exact "
          f"duplicates = {len(prompts)} requests; {total:,} prompt tokens; outputs {args.output[0]}-"
          f"{args.output[1]} tokens ({sum(max_tokens):,}), greedy, ignore_eos")
    print(f"oracle (infinite cache): computes {total - oracle_skip:,} distinct-prefix tokens once, "
          f"skips {oracle_skip:,}\n")
    runs = {p: [] for p in POLICIES}
    tokens = {}
    for r in range(args.repeats):
        for policy in POLICIES if r % 2 == 0 else POLICIES[::-1]:
            result, tokens[policy] = run_policy(llm, policy, prompts, max_tokens, duplicate, num_blocks)
            runs[policy].append(result)
        assert tokens["prefix"] == tokens["fcfs"], "the policies gave different tokens"
    print("| policy | output tok/s | elapsed s | prefix hit rate | prefill tokens computed | skipped / oracle's "
          "skip | preemptions | evictions | deduplicated |")
    print("|---|---|---|---|---|---|---|---|---|")
    best = {}
    for policy in POLICIES:
        r = best[policy] = max(runs[policy], key=lambda x: x["output_tok_s"])
        r["oracle_share"] = (total - r["prefill_computed"]) / oracle_skip if oracle_skip else 1.0
        print(f"| {policy} | {r['output_tok_s']:.1f} | {r['elapsed_s']:.1f} | {r['prefix_hit_rate']:.1%} | "
              f"{r['prefill_computed']:,} of {total:,} | {r['oracle_share']:.1%} | {r['preemptions']} | "
              f"{r['evictions']} | {r['deduplicated']} |")
    ratio = best["prefix"]["output_tok_s"] / best["fcfs"]["output_tok_s"]
    print(f"\nprefix / fcfs output tok/s: {ratio:.2f}x (target >= 1.5x; best of {args.repeats} run(s) each); "
          f"prefill computed prefix / fcfs: "
          f"{best['prefix']['prefill_computed'] / best['fcfs']['prefill_computed']:.2f}; prefix skipped "
          f"{best['prefix']['oracle_share']:.1%} of the oracle's skip (target >= 90%); every request's tokens "
          f"are the same under both policies")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    with open(args.json, "w") as f:
        json.dump({"config": vars(args), "num_blocks": num_blocks, "hardware": hardware(), "prompt_tokens": total,
                   "oracle_skip": oracle_skip, "runs": runs, "ratio": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
