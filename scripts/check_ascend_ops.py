"""Checks the KV-cache ops of one attention backend against the numpy references (tests/ops_reference.py)
on random decode and chunked-prefill batches, and prints the largest error per case.

    python scripts/check_ascend_ops.py --backend ms_atb        # on an Ascend machine, after build_ascend_ops.sh
    python scripts/check_ascend_ops.py --backend ascendc       # the same kernels on the CPU, through our
                                                               # implementation of the Ascend C API subset
Exit status 1 when an error is above tolerance (float16 2^-10, bfloat16 2^-7, relative to max(1, |ref|)).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from ops_reference import paged_attention_ref, reshape_and_cache_ref  # noqa: E402

TOLERANCE = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
# (num_heads, num_kv_heads, head_dim, block_size, [(context_len, num_queries), ...])
CASES = [(32, 8, 128, 128, [(2048, 1), (1100, 8), (129, 129), (5, 5)]),
         (9, 3, 64, 16, [(1, 1), (300, 1), (100, 37), (48, 16)]),
         (8, 2, 128, 16, [(700, 1), (40, 40)])]


def check(backend, dtype_name, h, kvh, d, bs, seqs, rng):
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
    kc, vc = (Tensor(np.zeros((nb, bs, kvh, d), np.float32)).astype(dtype) for _ in range(2))
    reshape_and_cache(Tensor(key).astype(dtype), Tensor(value).astype(dtype), kc, vc, Tensor(slots), backend=backend)
    f32 = lambda t: t.astype(ms.float32).asnumpy()  # noqa: E731
    zeros = np.zeros((nb, bs, kvh, d), np.float32)
    stored = lambda x: f32(Tensor(x).astype(dtype))  # noqa: E731
    kc_ref, vc_ref = reshape_and_cache_ref(stored(key), stored(value), zeros, zeros, slots)
    cache_ok = np.array_equal(f32(kc), kc_ref) and np.array_equal(f32(vc), vc_ref)
    qsl = np.concatenate([[0], np.cumsum([q for _, q in seqs])]).astype(np.int32)
    lens = np.array([c for c, _ in seqs], np.int32)
    query = Tensor(rng.standard_normal((int(qsl[-1]), h, d)).astype(np.float32)).astype(dtype)
    out = paged_attention(query, kc, vc, Tensor(tables), Tensor(lens), Tensor(qsl), d ** -0.5, backend=backend)
    ref = paged_attention_ref(f32(query), kc_ref, vc_ref, tables, lens, qsl, d ** -0.5)
    err = np.max(np.abs(f32(out) - ref) / np.maximum(1.0, np.abs(ref)))
    ok = cache_ok and err <= TOLERANCE[dtype_name]
    print(f"{dtype_name:8s} H={h:2d} KVH={kvh} D={d:3d} BS={bs:3d} seqs={seqs}: cache {'exact' if cache_ok else 'WRONG'}"
          f", attention max relative error {err:.2e} {'ok' if ok else 'ABOVE TOLERANCE'}")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="ms_atb", choices=("ms_atb", "mindspore", "ascendc", "cpu"))
    parser.add_argument("--device-id", type=int, default=None, help="Ascend device id (default: DEVICE_ID's)")
    args = parser.parse_args()
    import mindspore as ms
    if args.backend in ("ms_atb", "mindspore"):
        ms.set_device("Ascend", *(() if args.device_id is None else (args.device_id,)))
    rng = np.random.default_rng(0)
    results = [check(args.backend, dtype, *case, rng) for dtype in ("float16", "bfloat16") for case in CASES]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
