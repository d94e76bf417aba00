"""Where one model step's time goes: run a step N times and let the kernels' profile print their share.

    MS_ATB_KERNEL_PROFILE=1 .venv/bin/python scripts/profile_step.py --batch 32 --ctx 256          # decode
    MS_ATB_KERNEL_PROFILE=1 .venv/bin/python scripts/profile_step.py --batch 1 --ctx 512 --new 512  # prefill
    MS_ATB_KERNEL_PROFILE=1 .venv/bin/python scripts/profile_step.py --batch 1 --activation-dtype int8
Prints the step's wall time (min / median); at exit the kernel profile prints each kernel's calls and total time,
covering the timed steps plus one untimed first step (graph compile excluded: it runs no kernel). Wall time minus
the kernels' time is MindSpore's framework overhead (op dispatch, output allocation) and the host-side step.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_model import make_step, smollm2_path  # noqa: E402
from script_args import require_at_least  # noqa: E402

from ms_atb.config import EngineConfig  # noqa: E402
from ms_atb.worker.model_runner import ModelRunner  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=256, help="context length of each sequence")
    ap.add_argument("--new", type=int, default=1, help="tokens computed per sequence (1: decode)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--activation-dtype", default="float32", choices=["float32", "int8"],
                    help="model.activation_dtype (int8: the quantized linears' inputs, QuantDot kernels)")
    args = ap.parse_args()
    require_at_least(ap, args, 1, "batch", "ctx", "steps")
    if not 1 <= args.new <= args.ctx:
        raise SystemExit("--new must lie in [1, --ctx]")
    bs = 16
    blocks = (args.ctx + bs - 1) // bs
    runner = ModelRunner(EngineConfig.load(None, path=smollm2_path(), num_blocks=args.batch * blocks,
                                           block_size=bs, max_num_seqs=args.batch,
                                           max_num_batched_tokens=max(args.batch * args.new, 1),
                                           max_model_len=blocks * bs, activation_dtype=args.activation_dtype))
    step = make_step(args.batch, args.ctx, args.new, bs, blocks)
    runner.execute(step)  # compiles this step's graph
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        runner.execute(step)
        times.append(time.perf_counter() - start)
    times.sort()
    print(f"batch {args.batch}, context {args.ctx}, {args.new} new token(s) each: {args.steps} steps, "
          f"min {times[0] * 1e3:.1f} ms, median {times[len(times) // 2] * 1e3:.1f} ms; the kernel profile below "
          f"covers {args.steps + 1} steps", flush=True)


if __name__ == "__main__":
    main()
