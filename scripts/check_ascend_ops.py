"""Checks the KV-cache ops of one attention backend against the numpy references (tests/ops_reference.py)
on random decode and chunked-prefill batches, with caches of the queries' dtype and (--int8) int8 caches, and
prints the largest error per case.

    python scripts/check_ascend_ops.py --backend ms_atb        # on an Ascend machine, after build_ascend_ops.sh
    python scripts/check_ascend_ops.py --backend ascendc       # the same kernels on the CPU, through our
                                                               # implementation of the Ascend C API subset
    python scripts/check_ascend_ops.py --backend ms_atb --int8 # also int8 caches (quantised on write; prefill
                                                               # chunks reach the Cube widened by the AIVs)
Exit status 1 when an error is above tolerance (float16 2^-10, bfloat16 2^-7, relative to max(1, |ref|)).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from ops_reference import (dequantize_ref, paged_attention_ref, reshape_and_cache_int8_ref,  # noqa: E402
                           reshape_and_cache_ref)

TOLERANCE = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
# (num_heads, num_kv_heads, head_dim, block_size, [(context_len, num_queries), ...])
CASES = [(32, 8, 128, 128, [(2048, 1), (1100, 8), (129, 129), (5, 5)]),
         (9, 3, 64, 16, [(1, 1), (300, 1), (100, 37), (48, 16)]),
         (8, 2, 128, 16, [(700, 1), (40, 40)])]


def check(backend, dtype_name, int8, h, kvh, d, bs, seqs, rng):
    import mindspore as ms
    from mindspore import Tensor
    from ms_atb.ops import paged_attention, reshape_and_cache
    dtype = getattr(ms, dtype_name)
    need = [-(-c // bs) for c, _ in seqs]
    nb = sum(need) + 4
    ids = rng.permutation(nb)
    tables = np.zeros((len(seqs), max(need)), np.int32)
    for b, n in enumerate(need):
        tables[b, :n] = ids[sum(need[:b]):sum(need[:b]) + n]
    slots = np.array([tables[b, p // bs] * bs + p % bs for b, (c, _) in enumerate(seqs) for p in range(c)], np.int32)
    key, value = (rng.standard_normal((len(slots), kvh, d)).astype(np.float32) for _ in range(2))
    f32 = lambda t: t.astype(ms.float32).asnumpy()  # noqa: E731
    stored = lambda x: f32(Tensor(x).astype(dtype))  # noqa: E731
    if int8:  # caches [NB, BS, KVH, D] int8 and their scales [NB, BS, KVH] float32
        kc, vc = (Tensor(np.zeros((nb, bs, kvh, d), np.int8)) for _ in range(2))
        scales = [Tensor(np.zeros((nb, bs, kvh), np.float32)) for _ in range(2)]
        reshape_and_cache(Tensor(key).astype(dtype), Tensor(value).astype(dtype), kc, vc, Tensor(slots), *scales,
                          backend=backend)
        zeros_q, zeros_s = np.zeros((nb, bs, kvh, d), np.int8), np.zeros((nb, bs, kvh), np.float32)
        want = reshape_and_cache_int8_ref(stored(key), stored(value), zeros_q, zeros_q, zeros_s, zeros_s, slots)
        got = [kc.asnumpy(), vc.asnumpy()] + [s.asnumpy() for s in scales]
        cache_ok = all(np.array_equal(a, b) for a, b in zip(got, want))
        kc_ref, vc_ref = dequantize_ref(want[0], want[2]), dequantize_ref(want[1], want[3])
    else:
        scales = []
        kc, vc = (Tensor(np.zeros((nb, bs, kvh, d), np.float32)).astype(dtype) for _ in range(2))
        reshape_and_cache(Tensor(key).astype(dtype), Tensor(value).astype(dtype), kc, vc, Tensor(slots), backend=backend)
        zeros = np.zeros((nb, bs, kvh, d), np.float32)
        kc_ref, vc_ref = reshape_and_cache_ref(stored(key), stored(value), zeros, zeros, slots)
        cache_ok = np.array_equal(f32(kc), kc_ref) and np.array_equal(f32(vc), vc_ref)
    qsl = np.concatenate([[0], np.cumsum([q for _, q in seqs])]).astype(np.int32)
    lens = np.array([c for c, _ in seqs], np.int32)
    query = Tensor(rng.standard_normal((int(qsl[-1]), h, d)).astype(np.float32)).astype(dtype)
    out = paged_attention(query, kc, vc, Tensor(tables), Tensor(lens), Tensor(qsl), d ** -0.5, *scales, backend=backend)
    ref = paged_attention_ref(f32(query), kc_ref, vc_ref, tables, lens, qsl, d ** -0.5)
    err = np.max(np.abs(f32(out) - ref) / np.maximum(1.0, np.abs(ref)))
    ok = cache_ok and err <= TOLERANCE[dtype_name]
    print(f"{dtype_name:8s} {'int8' if int8 else 'same'} H={h:2d} KVH={kvh} D={d:3d} BS={bs:3d} seqs={seqs}: cache {'exact' if cache_ok else 'WRONG'}"
          f", attention max relative error {err:.2e} {'ok' if ok else 'ABOVE TOLERANCE'}")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="ms_atb", choices=("ms_atb", "mindspore", "ascendc", "cpu"))
    parser.add_argument("--device-id", type=int, default=None, help="Ascend device id (default: DEVICE_ID's)")
    parser.add_argument("--int8", action="store_true", help="also check int8 caches")
    args = parser.parse_args()
    import mindspore as ms
    if args.backend in ("ms_atb", "mindspore"):
        ms.set_device("Ascend", *(() if args.device_id is None else (args.device_id,)))
    rng = np.random.default_rng(0)
    results = [check(args.backend, dtype, int8, *case, rng) for int8 in ((False, True) if args.int8 else (False,))
               for dtype in ("float16", "bfloat16") for case in CASES]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
