"""The fused decoder-layer path against the unfused one (one op each for rotary embedding, split, reshapes,
cache write, residual add and norm) in ONE process, steps alternated, so both see the same host load.

    .venv/bin/python scripts/research/fused_layer_ab.py --batch 1 --ctx 256 --steps 40
The unfused model is built with the layers' fused-path choice turned off (the attention backend seen as
another one and AddRmsNorm as Add + RmsNorm): one op per step of the formula in every layer (the top of the
graph, LastTokenNorm, is the same one op in both). Prints each model's
first execute (graph compile), step min / median, the process's CPU time per step (all threads; with
MS_ATB_NUM_THREADS=1 the kernels' pool does not spin, so it is the work done whatever the host's load), and
the median of the paired differences.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_model import make_step, smollm2_path  # noqa: E402

import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402

from ms_atb.config import EngineConfig  # noqa: E402
from ms_atb.models import llama_layers  # noqa: E402
from ms_atb.ops import RmsNorm  # noqa: E402
from ms_atb.worker.model_runner import ModelRunner  # noqa: E402


class AddThenRmsNorm(nn.Cell):
    def __init__(self, eps, dtype=ms.float32, device="cpu"):
        super().__init__()
        self.norm = RmsNorm(eps, dtype, device)

    def construct(self, x, residual, weight):
        h = x + residual
        return h, self.norm(h, weight)


def build(args, fused):
    saved = llama_layers.resolve_backend, llama_layers.AddRmsNorm
    if not fused:
        llama_layers.resolve_backend = lambda device, backend: "unfused"
        llama_layers.AddRmsNorm = AddThenRmsNorm
    try:
        bs = 16
        blocks = (args.ctx + bs - 1) // bs
        return ModelRunner(EngineConfig.load(None, path=args.model or smollm2_path(), num_blocks=args.batch * blocks,
                                             block_size=bs, max_num_seqs=args.batch,
                                             max_num_batched_tokens=max(args.batch * args.new, 1),
                                             max_model_len=blocks * bs)), blocks
    finally:
        llama_layers.resolve_backend, llama_layers.AddRmsNorm = saved


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--new", type=int, default=1)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--model", help="model path (default: the embedded SmolLM2); e.g. "
                    "'random:tiny-llama?num_hidden_layers=30', where a step is almost all op dispatch")
    ap.add_argument("--fused-first", action="store_true", help="build and compile the fused model first")
    args = ap.parse_args()
    runners = {}
    for name in ("fused", "unfused") if args.fused_first else ("unfused", "fused"):
        runners[name], blocks = build(args, name == "fused")
    assert all(layer.self_attn.fused for layer in runners["fused"].model.layers)
    assert not any(layer.self_attn.fused for layer in runners["unfused"].model.layers)
    step = make_step(args.batch, args.ctx, args.new, 16, blocks)
    compile_s, logits = {}, {}
    for name, runner in runners.items():
        start = time.perf_counter()
        logits[name] = runner.execute(step)
        compile_s[name] = time.perf_counter() - start
    times = {name: [] for name in runners}
    cpu = {name: [] for name in runners}   # the process's CPU seconds (all threads) per step
    for _ in range(args.steps):
        for name, runner in runners.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            runner.execute(step)
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    diffs = sorted(u - f for u, f in zip(times["unfused"], times["fused"]))
    print(f"batch {args.batch}, context {args.ctx}, {args.new} new token(s), {args.steps} alternated steps; "
          f"load {os.getloadavg()[0]:.1f}; max |logit difference| "
          f"{abs(logits['fused'] - logits['unfused']).max():.2e}")
    for name, ts in times.items():
        ts = sorted(ts)
        print(f"  {name:8s} first execute (compile + 1 step) {compile_s[name]:.2f} s; step min {ts[0] * 1e3:.1f} ms, "
              f"median {ts[len(ts) // 2] * 1e3:.1f} ms; CPU time per step median "
              f"{sorted(cpu[name])[len(ts) // 2] * 1e3:.1f} ms")
    print(f"  unfused - fused, paired: median {diffs[len(diffs) // 2] * 1e3:.1f} ms, "
          f"quartiles [{diffs[len(diffs) // 4] * 1e3:.1f}, {diffs[3 * len(diffs) // 4] * 1e3:.1f}] ms")


if __name__ == "__main__":
    main()
