"""Where one model step's time goes: run a step N times and let the kernels' profile print their share.

    MS_ATB_KERNEL_PROFILE=1 .venv/bin/python scripts/profile_step.py --batch 32 --ctx 256          # decode
    MS_ATB_KERNEL_PROFILE=1 .venv/bin/python scripts/profile_step.py --batch 1 --ctx 512 --new 512  # prefill
    .venv/bin/python scripts/profile_step.py --batch 1 --ctx 256 --host     # the host side of a decode step
    MS_ATB_KERNEL_PROFILE=1 .venv/bin/python scripts/profile_step.py --batch 1 --activation-dtype int8
    MS_ATB_KERNEL_PROFILE=1 .venv/bin/python scripts/profile_step.py --batch 1 --ctx 512 --activation-dtype auto \
        --model /tmp/llama-1b-q4_0.gguf                  # a 1B shape from make_random_gguf.py
Prints the step's wall time and the process's CPU time in it (min / median); at exit the kernel profile prints
each kernel's calls and total time, covering the timed steps plus one untimed first step (graph compile excluded:
it runs no kernel). Wall time minus the kernels' time is MindSpore's framework overhead (op dispatch, output
allocation) and the host-side step.
With --host it also times, step by step in turns so that all see the same load: the step's input preparation
(padding and tensors), the model graph run as the runner runs it (GraphCall) and as an ordinary Cell call
(which checks and looks up the compiled graph on every call), each in wall time and in the process's CPU time
(all threads: on a shared host the less noisy figure).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_model import make_step, smollm2_path  # noqa: E402
from script_args import require_at_least  # noqa: E402

import mindspore as ms  # noqa: E402

from ms_atb.config import EngineConfig  # noqa: E402
from ms_atb.worker.model_runner import ModelRunner  # noqa: E402


def _summary(label, times) -> str:
    times = sorted(times)
    return f"{label} min {times[0] * 1e3:.2f} ms, median {times[len(times) // 2] * 1e3:.2f} ms"


def host_split(runner, step, steps) -> None:
    """Times preparation, the graph call and the ordinary Cell call of one step, interleaved."""
    arrays, _ = runner.prepare(step)
    bucket = len(arrays[0])
    prep, call, plain, call_cpu, plain_cpu = [], [], [], [], []
    for _ in range(steps):
        start = time.perf_counter()
        arrays, _ = runner.prepare(step)
        tensors = [ms.Tensor.from_numpy(a) for a in arrays]
        prep.append(time.perf_counter() - start)
        for run, wall, cpu in ((lambda: runner.graph_call(bucket, *tensors), call, call_cpu),
                               (lambda: runner.model(*tensors), plain, plain_cpu)):
            start, start_cpu = time.perf_counter(), time.process_time()
            run().asnumpy()
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    print(f"host split over {steps} steps: {_summary('prepare', prep)}; wall: {_summary('graph call', call)}, "
          f"{_summary('ordinary Cell call', plain)}; CPU time (all threads): {_summary('graph call', call_cpu)}, "
          f"{_summary('ordinary Cell call', plain_cpu)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=256, help="context length of each sequence")
    ap.add_argument("--new", type=int, default=1, help="tokens computed per sequence (1: decode)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--host", action="store_true",
                    help="also time preparation, the graph call and the ordinary Cell call, in turns")
    ap.add_argument("--activation-dtype", default="float32", choices=["float32", "int8", "auto"],
                    help="model.activation_dtype (int8: the quantized linears' inputs, QuantDot kernels)")
    ap.add_argument("--cache-dtype", default="auto", help="model.cache_dtype (auto: float16 on the CPU)")
    ap.add_argument("--model", default=None,
                    help="a GGUF or model folder (default: the embedded SmolLM2), e.g. one of make_random_gguf.py")
    args = ap.parse_args()
    require_at_least(ap, args, 1, "batch", "ctx", "steps")
    if not 1 <= args.new <= args.ctx:
        raise SystemExit("--new must lie in [1, --ctx]")
    bs = 16
    blocks = (args.ctx + bs - 1) // bs
    runner = ModelRunner(EngineConfig.load(None, path=args.model or smollm2_path(), num_blocks=args.batch * blocks,
                                           block_size=bs, max_num_seqs=args.batch,
                                           max_num_batched_tokens=max(args.batch * args.new, 1),
                                           max_model_len=blocks * bs, activation_dtype=args.activation_dtype,
                                           cache_dtype=args.cache_dtype))
    step = make_step(args.batch, args.ctx, args.new, bs, blocks)
    runner.execute(step)  # compiles this step's graph
    times, cpu = [], []
    for _ in range(args.steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        runner.execute(step)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    times.sort()
    print(f"batch {args.batch}, context {args.ctx}, {args.new} new token(s) each: {args.steps} steps, "
          f"min {times[0] * 1e3:.1f} ms, median {times[len(times) // 2] * 1e3:.1f} ms; "
          f"{_summary('CPU time (all threads)', cpu)}; the kernel profile below covers {args.steps + 1} steps",
          flush=True)
    if args.host:
        host_split(runner, step, args.steps)


if __name__ == "__main__":
    main()
