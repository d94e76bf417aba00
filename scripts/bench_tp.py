"""Tensor-parallel step-time probe: decode steps at batch 1 and 8 (context ~64) through ModelRunner, one
AllReduce of [T, hidden] float32 alone, and a crc of the logits so ranks can be compared bit for bit.
Run: python scripts/bench_tp.py MODEL (tp 1), or under msrun --worker_num=2 --local_worker_num=2 ... (tp 2)."""
import os, sys, time, zlib
from types import SimpleNamespace
import numpy as np
import mindspore as ms
from mindspore import nn, ops
from ms_atb.config import EngineConfig
from ms_atb.worker.distributed import init_distributed
from ms_atb.worker.model_runner import ModelRunner

model = sys.argv[1]
tp = int(os.environ.get("MS_WORKER_NUM", "1"))
rank = init_distributed(tp)
bs, ctx, n = 16, 64, int(os.environ.get("STEPS", "30"))
r = ModelRunner(EngineConfig.load(None, path=model, num_blocks=64, block_size=bs, max_num_seqs=8,
                                  max_num_batched_tokens=8, max_model_len=256, tensor_parallel_size=tp),
                tp_rank=rank)
t0 = time.perf_counter(); r.warmup(); compile_s = time.perf_counter() - t0
h = r.model_config.hidden_size


def step(b):
    tables = [list(range(i * 5, i * 5 + 5)) for i in range(b)]
    return SimpleNamespace(request_ids=[str(i) for i in range(b)], token_ids=[(7 * i) % 256 for i in range(b)],
                           positions=[ctx - 1] * b, slot_mapping=[t[(ctx - 1) // bs] * bs + (ctx - 1) % bs for t in tables],
                           block_tables=tables, context_lens=[ctx] * b, query_start_loc=list(range(b + 1)))


res = {}
for b in (1, 8):
    s = step(b)
    logits = r.execute(s)
    times = []
    for _ in range(n):
        t = time.perf_counter(); r.execute(s); times.append(time.perf_counter() - t)
    res[b] = (np.median(times) * 1e3, zlib.crc32(logits.tobytes()))
if tp > 1:
    class AR(nn.Cell):
        def __init__(self):
            super().__init__(); self.ar = ops.AllReduce()
        def construct(self, x): return self.ar(x)
    ar = AR()
    for t_ in (1, 8):
        x = ms.Tensor(np.ones((t_, h), np.float32)); ar(x).asnumpy()
        times = []
        for _ in range(200):
            t = time.perf_counter(); ar(x).asnumpy(); times.append(time.perf_counter() - t)
        res[f"allreduce[{t_},{h}]"] = (np.median(times) * 1e3, None)
    class Noop(nn.Cell):
        def construct(self, x): return x + 0.0
    noop, x = Noop(), ms.Tensor(np.ones((8, h), np.float32))
    noop(x).asnumpy()
    times = []
    for _ in range(200):
        t = time.perf_counter(); noop(x).asnumpy(); times.append(time.perf_counter() - t)
    res["graph call without collective"] = (np.median(times) * 1e3, None)
print(f"RESULT tp={tp} rank={rank} model={model} layers={r.model_config.num_hidden_layers} compile={compile_s:.1f}s "
      + " ".join(f"{k}: {v[0]:.2f}ms crc={v[1]}" for k, v in res.items()), flush=True)
