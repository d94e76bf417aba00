"""Per-op dispatch cost of MindSpore graph mode on the CPU: a Cell of N chained ops of one kind, timed
per call, for N and 2N; the difference over N is one op's cost.

    .venv/bin/python scripts/research/op_dispatch_cost.py [--n 30] [--calls 200]
Kinds: the RmsNorm aot kernel on [1, 576], a Reshape pair, ops.depend, a tensor add, a split into 3.
"""
import argparse
import time

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from ms_atb.ops import RmsNorm

ms.set_context(mode=ms.GRAPH_MODE)


class Chain(nn.Cell):
    def __init__(self, kind, n):
        super().__init__()
        self.kind, self.n = kind, n
        self.norm = RmsNorm(1e-5)
        self.w = ms.Tensor(np.ones(576, np.float32))

    def construct(self, x, y):  # [1, 576] each
        for _ in range(self.n):
            if self.kind == "aot":
                x = self.norm(x, self.w)
            elif self.kind == "reshape":
                x = x.reshape(1, 9, 64).reshape(1, 576)
            elif self.kind == "depend":
                x = ops.depend(x, y)
            elif self.kind == "add":
                x, y = x + y, x
            elif self.kind == "slice":
                x = ops.concat((x[:, 288:], x[:, :288]), -1)
            elif self.kind == "concat":
                x = ops.concat((x, y), -1).reshape(2, 576)[1:2]
            elif self.kind == "split":
                a, b, c = ops.split(x, (384, 96, 96), -1)
                x = ops.concat((c, b, a), -1)
        return x


def per_call(kind, n, calls):
    cell = Chain(kind, n)
    x = ms.Tensor(np.random.rand(1, 576).astype(np.float32))
    y = ms.Tensor(np.random.rand(1, 576).astype(np.float32))
    cell(x, y).asnumpy()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        cell(x, y).asnumpy()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 4], times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--kinds", default="aot,reshape,depend,add,split,slice")
    a = ap.parse_args()
    for kind in a.kinds.split(","):
        q1, med1 = per_call(kind, a.n, a.calls)
        q2, med2 = per_call(kind, 2 * a.n, a.calls)
        print(f"{kind:8s} N={a.n}: p25 {q1 * 1e3:.2f} ms median {med1 * 1e3:.2f} ms; 2N: p25 {q2 * 1e3:.2f} "
              f"median {med2 * 1e3:.2f} ms; per op (p25) {(q2 - q1) / a.n * 1e6:.1f} us, "
              f"(median) {(med2 - med1) / a.n * 1e6:.1f} us", flush=True)


if __name__ == "__main__":
    main()
