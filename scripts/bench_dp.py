"""Data parallelism on this machine: one JSONL input run by ms-atb-generate as one process (dp=1) and under msrun
as two replicas (dp=2, scripts/msrun_generate.sh), alternating; then a dp=2 job whose replica 1 is killed half-way
through its share, and its --resume. Prints job times, the lines the kill left, and whether every output equals
the dp=1 run's.

    .venv/bin/python scripts/bench_dp.py                    # tiny model, 32 requests, 2 rounds (~5 min)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def results(path: str) -> dict:
    """{id: token_ids} of the complete lines of a result file."""
    with open(path, "rb") as f:
        return {r["id"]: r["token_ids"] for r in map(json.loads, (x for x in f if x.endswith(b"\n")))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "tiny_llama.yaml"))
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    if args.requests < 4 or args.rounds < 1:
        p.error("--requests must be >= 4 and --rounds >= 1")
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ["PATH"])
    work = tempfile.mkdtemp(prefix="bench_dp_")
    rng = random.Random(7)
    ids = [f"q{i}" for i in range(args.requests)]
    source = os.path.join(work, "in.jsonl")
    with open(source, "w") as f:
        for rid in ids:
            f.write(json.dumps({"id": rid, "prompt": [rng.randrange(500) for _ in range(rng.randrange(8, 120))]}) + "\n")
    common = ["--config", args.config, "--input", source, "--max-tokens", str(args.max_tokens), "--ignore-eos",
              "--no-progress", "--set", "max_num_batched_tokens=64", "--set", "max_num_seqs=8"]

    def dp2(out, extra=(), wait=True):
        cmd = ["bash", os.path.join(ROOT, "scripts", "msrun_generate.sh"), "-n", "1", "--dp", "2", "--master-port",
               str(free_port()), "--log-dir", out + ".logs", "--"] + common + ["--output", out] + list(extra)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        return proc.communicate()[0] if wait else proc

    def dp1(out):
        subprocess.run([os.path.join(BIN, "ms-atb-generate")] + common + ["--output", out], env=env,
                       capture_output=True, check=True)

    print(f"{args.requests} requests, tiny model, --max-tokens {args.max_tokens}; load {os.getloadavg()[0]:.1f}")
    reference = None
    for r in range(args.rounds):
        for kind, run in (("dp=1", dp1), ("dp=2", dp2)):
            out = os.path.join(work, f"{kind[-1]}_{r}.jsonl")
            t0 = time.perf_counter()
            run(out)
            got = results(out)
            reference = reference or got
            print(f"{kind} round {r}: job {time.perf_counter() - t0:.1f} s, {len(got)} results, "
                  f"equal to dp=1: {got == reference}", flush=True)

    out = os.path.join(work, "killed.jsonl")
    part = out + ".part1-of-2"
    t0 = time.perf_counter()
    proc = dp2(out, wait=False)
    while proc.poll() is None:
        if os.path.exists(part) and len(results(part)) >= args.requests // 4:      # half of replica 1's share
            os.kill(int(open(part + ".lock").read().split()[1]), signal.SIGKILL)
            break
        time.sleep(0.05)
    log, killed_at = proc.communicate()[0], time.perf_counter()
    kept = {}
    for k in (0, 1):
        kept.update(results(f"{out}.part{k}-of-2"))
    named = [line for line in log.splitlines() if "failed first" in line]
    print(f"killed: exit status {proc.returncode}, {named[0].strip() if named else 'no rank named'}; "
          f"{len(kept)} of {args.requests} lines kept, all equal to dp=1: "
          f"{all(reference[i] == t for i, t in kept.items())}; job {killed_at - t0:.1f} s")
    t0 = time.perf_counter()
    dp2(out, ["--resume"])
    final = [json.loads(line)["id"] for line in open(out)]
    print(f"--resume: {time.perf_counter() - t0:.1f} s; input order: {final == ids}; equal to dp=1: "
          f"{results(out) == reference}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
