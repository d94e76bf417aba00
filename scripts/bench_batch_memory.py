"""Peak memory and wall time per line of `ms-atb-generate` as the input grows.

Each size runs the command in a process of its own on the tiny config (configs/tiny_llama.yaml: seeded random
weights, no files), one token per request (`--max-tokens 1`, the job's own machinery dominates), prompts of 4-12
token ids drawn from a fixed seed. Peak RSS is the child's ru_maxrss. The streamed job should hold its peak flat:
the last size's peak within 1.2x the first's, and its wall time per line no worse.

    .venv/bin/python scripts/bench_batch_memory.py [--lines 10000,100000,1000000] [--keep DIR]
"""
import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CONFIG = os.path.join(ROOT, "configs", "tiny_llama.yaml")


def write_input(path: str, lines: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(lines):
            prompt = [rng.randrange(1, 256) for _ in range(rng.randrange(4, 13))]
            f.write(json.dumps({"id": f"r{i}", "prompt": prompt}) + "\n")


def run(lines: int, folder: str) -> dict:
    inp, out = os.path.join(folder, f"in{lines}.jsonl"), os.path.join(folder, f"out{lines}.jsonl")
    write_input(inp, lines)
    command = [sys.executable, "-m", "ms_atb.batch.cli", "--config", CONFIG, "--input", inp, "--output", out,
               "--max-tokens", "1", "--no-progress", "--overwrite"]
    env = dict(os.environ, MS_ATB_QUIET="1")
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)          # this child's own peak, not the largest child's so far
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{lines} lines: exit {proc.returncode}\n{err.read().decode()[-2000:]}")
    with open(out, "rb") as f:
        written = sum(1 for _ in f)
    assert written == lines, (written, lines)
    return {"lines": lines, "wall_s": wall, "us_per_line": wall / lines * 1e6, "peak_rss_mib": usage.ru_maxrss / 1024}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", default="10000,100000,1000000", help="comma-separated input sizes, ascending")
    p.add_argument("--keep", default=None, help="keep the inputs and outputs in this folder")
    args = p.parse_args()
    sizes = [int(x) for x in args.lines.split(",")]
    folder = args.keep or tempfile.mkdtemp(prefix="ms_atb_batch_memory_")
    os.makedirs(folder, exist_ok=True)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    print("| lines | wall (s) | us / line | peak RSS (MiB) | peak / first |")
    print("|---:|---:|---:|---:|---:|")
    rows = []
    try:
        for n in sizes:
            rows.append(run(n, folder))
            r = rows[-1]
            print(f"| {n:,} | {r['wall_s']:.1f} | {r['us_per_line']:.0f} | {r['peak_rss_mib']:.0f} | "
                  f"{r['peak_rss_mib'] / rows[0]['peak_rss_mib']:.3f} |", flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
