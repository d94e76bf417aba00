"""Where the time to the first generated token goes, cold (an empty graph cache) and warm (the second run).

Each run is a fresh process on the embedded default (configs/smollm2_135m.yaml), one chat prompt, one output
token, with the graph cache (and the weights kept beside it) in a fresh directory shared by the runs. The parent
times the process from its start to the first token; the process reports its phases: importing MindSpore and
ms_atb, preparing the engine (config, tokenizer), the kernel library's load (built at install by
scripts/setup_env.sh), the model runner (weights), and each graph compiled or loaded, in wall and CPU seconds.
The C++ kernels' build is not counted: it happens at install.
Memory: each run also reports its peak RSS growth over its RSS once MindSpore and ms_atb are imported (the
kernel's high-water mark, VmHWM; KV pages count as they are written), against the model file's size, and the
size of the weight cache entry on disk. --model runs another model file (e.g. a GGUF from
scripts/make_random_gguf.py) under the same config; a GGUF's weight cache entry is written by a thread of its own
while the first token is computed (the process waits for it before it exits).
With --cli each run is instead a whole `ms-atb-generate --chat --max-tokens 1` process on that prompt, timed
from its start to its exit: wall seconds, and CPU seconds (user + sys, its threads included) from the OS.
    .venv/bin/python scripts/bench_startup.py [--runs 2] [--cli] [--config configs/smollm2_135m.yaml]
                                              [--model FILE] [--set KEY=VALUE]
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

PROMPT = "What is the capital of France?"

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def child(config: str, overrides: list[str]) -> None:
    """One run; prints `PHASES <json>` once the first token is out."""
    from ms_atb.batch import quiet
    quiet.set_up()
    phases, t, c = {}, time.perf_counter(), time.process_time()

    def mark(name):       # (wall s, CPU s of this process): the CPU figure holds on a loaded host
        nonlocal t, c
        now, cpu = time.perf_counter(), time.process_time()
        phases[name] = (round(now - t, 3), round(cpu - c, 3))
        t, c = now, cpu
    import mindspore  # noqa: F401
    mark("import mindspore")
    import yaml
    from ms_atb import LLM, SamplingParams
    import ms_atb.llm  # noqa: F401
    mark("import ms_atb")
    base_rss = status_bytes("VmRSS")
    keywords = {k.rpartition(".")[2]: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in overrides)}
    llm = LLM.prepare(config, default_policy="prefix", **keywords)
    mark("prepare (config, tokenizer, KV budget)")
    from ms_atb.ops.build import loaded_kernel_library
    loaded_kernel_library()
    mark("kernel library (built at install)")
    llm.build()
    mark("model runner (weights) + graph cache open")
    out = llm.chat([{"role": "user", "content": PROMPT}],
                   SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    mark("first token (graphs + prefill)")
    runner = llm.runner
    peak = status_bytes("VmHWM") - base_rss
    model = llm.config.model.path
    print("PHASES " + json.dumps({"phases": phases, "graphs": runner.graph_log, "cache": runner.graph_stats(),
                                  "token": out[0].token_ids, "peak_rss_growth": peak,
                                  "model_bytes": os.path.getsize(model) if os.path.isfile(model) else None,
                                  "weight_cache": str(runner.weight_cache.data_path)
                                  if runner.weight_cache.folder else None}), flush=True)


def status_bytes(field: str) -> int:
    """A size field of /proc/self/status (VmRSS, VmHWM) in bytes."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def cli_runs(runs: int, config: str, cache: str, overrides: list[str]) -> int:
    """Each run one ms-atb-generate process: wall and CPU seconds from its start to its exit."""
    folder = tempfile.mkdtemp(prefix="ms_atb_cli_")
    prompts, output = os.path.join(folder, "prompt.txt"), os.path.join(folder, "out.jsonl")
    with open(prompts, "w", encoding="utf-8") as f:
        f.write(PROMPT + "\n")
    cmd = [os.path.join(os.path.dirname(sys.executable), "ms-atb-generate"), "--config", config, "--input",
           prompts, "--output", output, "--overwrite", "--chat", "--max-tokens", "1", "--no-progress",
           "--set", f"compile_cache={cache}"] + [x for s in overrides for x in ("--set", s)]
    try:
        for run in range(runs):
            before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
            if proc.returncode != 0:
                print(f"run {run + 1}: failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
                return 1
            with open(output, encoding="utf-8") as f:
                token_ids = json.loads(f.readline())["token_ids"]
            user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
            print(f"run {run + 1} ({'cold' if run == 0 else 'warm'}): ms-atb-generate start to exit {wall:.1f} s "
                  f"wall, {user + system:.1f} s CPU ({user:.1f} user + {system:.1f} sys); token {token_ids}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="the first is cold, the others warm")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "smollm2_135m.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--model", help="the model file to run (the config's model.path otherwise)")
    ap.add_argument("--cli", action="store_true", help="time whole ms-atb-generate processes instead")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.model:
        args.set.append(f"path={os.path.abspath(args.model)}")
    if args.child:
        return child(args.config, args.set)
    if args.runs < 1:
        ap.error(f"--runs must be >= 1, got {args.runs}")
    cache = tempfile.mkdtemp(prefix="ms_atb_graphs_")
    try:
        if args.cli:
            return cli_runs(args.runs, args.config, cache, args.set)
        return child_runs(args.runs, args.config, cache, args.set)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def print_memory(report: dict, exit_code: int) -> None:
    """Peak RSS growth and the weight cache entry, against the model file (exit_code: the process has ended, so
    the entry it wrote is complete)."""
    peak, size = report["peak_rss_growth"], report["model_bytes"]
    line = f"  peak RSS growth over the post-import RSS: {peak / 2**20:,.0f} MiB"
    if size:
        line += f" = {peak / size:.2f}x the model file ({size / 2**20:,.0f} MiB)"
    entry = report["weight_cache"]
    if entry and os.path.exists(entry):
        line += f"; weight cache entry {os.path.getsize(entry) / 2**20:,.0f} MiB"
        line += f" = {os.path.getsize(entry) / size:.2f}x the file" if size else ""
    print(line)


def child_runs(runs: int, config: str, cache: str, overrides: list[str]) -> int:
    """Each run one child process reporting its phases."""
    for run in range(runs):
        start = time.perf_counter()
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--config", config,
               "--set", f"compile_cache={cache}"] + [x for s in overrides for x in ("--set", s)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        report = None
        for line in proc.stdout:
            if line.startswith("PHASES "):
                first = time.perf_counter() - start
                report = json.loads(line[7:])
        proc.wait()
        if report is None:
            print(f"run {run + 1}: failed (exit {proc.returncode})")
            return 1
        c = report["cache"]
        print(f"run {run + 1} ({'cold' if run == 0 else 'warm'}): first token {first:.1f} s after process start "
              f"(interpreter start and process exit aside: {sum(w for w, _ in report['phases'].values()):.1f} s "
              f"wall, {sum(c for _, c in report['phases'].values()):.1f} s CPU)")
        for name, (wall, cpu) in report["phases"].items():
            print(f"  {name:45s} {wall:6.2f} s wall {cpu:6.2f} s CPU")
        print_memory(report, proc.returncode)
        print(f"  graphs: {', '.join(f'{b} tokens {s:.1f} s' for b, s in report['graphs'])}; "
              f"{c['graphs_loaded']} loaded, {c['graphs_saved']} compiled and saved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
