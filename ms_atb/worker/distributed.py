"""Tensor-parallel processes: communication set-up under msrun, and the SPMD consistency check.

Every rank runs the same scheduler on the same inputs, so block tables agree everywhere and no
control messages are sent; only the model's AllReduces cross ranks. With MS_ATB_DEBUG=1 each
sampling step also AllGathers a digest of the sampled tokens and fails on every rank at the first
step where two ranks disagree (a rank that drifted would otherwise feed different tokens into the
next step's collectives). MindSpore imports are lazy: the engine's control plane stays importable
without it.
"""
from __future__ import annotations

import os
import zlib

import numpy as np

_DIGEST = 4  # [call index, number of tokens, crc32 high 16 bits, crc32 low 16 bits]


def world_size_from_env() -> int | None:
    """Processes msrun launched (all nodes), or None outside msrun."""
    n = os.environ.get("MS_WORKER_NUM")
    return int(n) if n else None


def init_distributed(tp_size: int) -> int:
    """Checks the launch against tensor_parallel_size, initialises communication; returns this rank.

    Called before any weight is read, so a wrong launch fails in seconds."""
    world = world_size_from_env()
    if tp_size == 1:
        if world is not None and world > 1:
            raise ValueError(f"tensor_parallel_size is 1 but msrun started {world} workers: each would "
                             f"run the whole model alone; set tensor_parallel_size={world} or launch "
                             f"without msrun")
        return 0
    if world is None and "RANK_TABLE_FILE" not in os.environ:
        raise ValueError(f"tensor_parallel_size {tp_size} needs one process per rank: launch with "
                         f"msrun --worker_num={tp_size} --local_worker_num={tp_size} ... "
                         f"(scripts/msrun_generate.sh)")
    if world is not None and world != tp_size:
        raise ValueError(f"tensor_parallel_size {tp_size} does not match the msrun world size {world} "
                         f"(--worker_num); they must be equal")
    from mindspore.communication import get_group_size, get_rank, init
    if not _initialised():
        init()
    size = get_group_size()
    if size != tp_size:
        raise ValueError(f"tensor_parallel_size {tp_size} does not match the communication world "
                         f"size {size}")
    return get_rank()


def _initialised() -> bool:
    from mindspore.communication import GlobalComm
    return bool(getattr(GlobalComm, "INITED", False))


def debug_enabled() -> bool:
    return os.environ.get("MS_ATB_DEBUG", "") not in ("", "0")


class SpmdCheck:
    """check(values, what): AllGathers a fixed-size int32 digest of `values` (one compiled graph)
    and raises AssertionError on every rank when the ranks' digests differ."""

    def __init__(self):
        import mindspore as ms
        from mindspore import nn, ops
        from mindspore.communication import get_group_size, get_rank

        class _Gather(nn.Cell):
            def __init__(self):
                super().__init__()
                self.all_gather = ops.AllGather()

            def construct(self, x):  # [K] -> [world * K]
                return self.all_gather(x)

        self._ms = ms
        self._gather = _Gather()
        self.rank, self.world = get_rank(), get_group_size()
        self.num_checks = 0

    def check(self, values, what: str = "values") -> None:
        values = np.asarray(values, np.int64).ravel()
        crc = zlib.crc32(values.tobytes())
        digest = np.array([self.num_checks, len(values), crc >> 16, crc & 0xFFFF], np.int32)  # [K]
        rows = self._gather(self._ms.Tensor(digest)).asnumpy().reshape(self.world, _DIGEST)  # [world, K]
        self.num_checks += 1
        bad = [r for r in range(self.world) if not np.array_equal(rows[r], rows[0])]
        if bad:
            raise AssertionError(f"SPMD divergence at check {self.num_checks - 1} ({what}): rank {bad[0]} "
                                 f"differs from rank 0 (digests [check, n, crc_hi, crc_lo] "
                                 f"{rows[0].tolist()} vs {rows[bad[0]].tolist()}); this is rank {self.rank}")


class SpmdSampler:
    """A Sampler whose every result is checked to be the same on all ranks (debug mode)."""

    def __init__(self, sampler, check: SpmdCheck):
        self.sampler, self.spmd_check = sampler, check

    def sample(self, logits, params, generators, histories=None, banned=None,
               allowed=None) -> list[int]:  # logits [B, V]
        tokens = self.sampler.sample(logits, params, generators, histories, banned, allowed)
        self.spmd_check.check([int(t) for t in tokens], "sampled token ids")
        return tokens


def spmd_sampler(sampler, tp_size: int):
    """`sampler` itself, or under tensor parallelism with MS_ATB_DEBUG=1 one checked on every call."""
    if tp_size == 1 or not debug_enabled():
        return sampler
    return SpmdSampler(sampler, SpmdCheck())
