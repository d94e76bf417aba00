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
import sys
import zlib

import numpy as np

_DIGEST = 4  # [call index, number of tokens, crc32 high 16 bits, crc32 low 16 bits]


def world_size_from_env() -> int | None:
    """Processes msrun launched (all nodes), or None outside msrun."""
    n = os.environ.get("MS_WORKER_NUM")
    return int(n) if n else None


def init_distributed(tp_size: int, dp_size: int = 1) -> int:
    """Checks the launch against tensor_parallel_size x data_parallel_size, initialises what tensor
    parallelism needs; returns this process's rank within its tensor-parallel group.

    Called before any weight is read, so a wrong launch fails in seconds. Global rank g belongs to replica
    g // tp_size as its tp rank g % tp_size. Replicas share no communicator: with tp_size 1 nothing is
    initialised (msrun's scheduler process, which runs this script too, has no job then and exits 0 here);
    with tp_size > 1 and several replicas each replica's ranks form a group of their own."""
    world = world_size_from_env()
    if not isinstance(dp_size, int) or dp_size < 1:
        raise ValueError(f"data_parallel_size must be an int >= 1, got {dp_size!r}")
    if tp_size == 1 and dp_size == 1:
        if world is not None and world > 1:
            raise ValueError(f"tensor_parallel_size is 1 but msrun started {world} workers: each would "
                             f"run the whole model alone; set data_parallel_size={world} (independent "
                             f"replicas), tensor_parallel_size={world}, or launch without msrun")
        return 0
    sizes = (f"tensor_parallel_size {tp_size}" if dp_size == 1 else
             f"tensor_parallel_size {tp_size} x data_parallel_size {dp_size}")
    if world is None and "RANK_TABLE_FILE" not in os.environ:
        raise ValueError(f"{sizes} needs one process per rank: launch with msrun --worker_num={tp_size * dp_size} "
                         f"--local_worker_num={tp_size * dp_size} ... (scripts/msrun_generate.sh)")
    if world is not None and world != tp_size * dp_size:
        raise ValueError(f"{sizes} does not match the msrun world size {world} (--worker_num); "
                         f"{'they' if dp_size == 1 else 'the product and it'} must be equal")
    if tp_size == 1:
        if os.environ.get("MS_ROLE") == "MS_SCHED":
            sys.exit(0)             # no communicator to schedule: the workers run on their own
        return 0
    from mindspore.communication import create_group, get_group_size, get_rank, init
    if not _initialised():
        init()
    size = get_group_size()
    if size != tp_size * dp_size:
        raise ValueError(f"{sizes} does not match the communication world size {size}")
    rank = get_rank()
    if dp_size > 1:
        from ms_atb.models.parallel import set_tp_group
        first = rank // tp_size * tp_size
        name = f"tp_group_{rank // tp_size}"
        create_group(name, list(range(first, first + tp_size)))
        set_tp_group(name)
    return rank % tp_size


def global_rank() -> int:
    """This process's rank among all msrun workers (0 outside msrun)."""
    if _initialised():
        from mindspore.communication import get_rank
        return get_rank()
    rank = os.environ.get("RANK_ID")
    if rank is None and world_size_from_env() not in (None, 1):
        raise ValueError("msrun assigned no RANK_ID to this worker: on several machines pass --node_rank to msrun "
                         "(scripts/msrun_generate.sh --node-rank)")
    return int(rank or 0)


def replica_index(tp_size: int, dp_size: int) -> int:
    """The data-parallel replica this process belongs to, 0..dp_size-1 (after init_distributed)."""
    return 0 if dp_size == 1 else global_rank() // tp_size


def _initialised() -> bool:
    from mindspore.communication import GlobalComm
    return bool(getattr(GlobalComm, "INITED", False))


def debug_enabled() -> bool:
    return os.environ.get("MS_ATB_DEBUG", "") not in ("", "0")


def _tp_all_gather():
    """(a graph-mode Cell AllGathering an int32 [K] over this replica's tensor-parallel ranks -> [world * K],
    its group's keyword, this rank, the world size)."""
    from mindspore import nn, ops
    from mindspore.communication import get_group_size, get_rank
    from ms_atb.models.parallel import tp_group
    group = {} if tp_group() is None else {"group": tp_group()}

    class _Gather(nn.Cell):
        def __init__(self):
            super().__init__()
            self.all_gather = ops.AllGather(**group)

        def construct(self, x):  # [K] -> [world * K]
            return self.all_gather(x)

    return _Gather(), get_rank(**group), get_group_size(**group)


def ranks_min():
    """n -> the least n of all tensor-parallel ranks (each rank calls it at the same points): what every rank
    can do when each decides from state of its own, such as how many blocks its shard of the disk tier holds."""
    import mindspore as ms
    gather = _tp_all_gather()[0]

    def least(n: int) -> int:
        return int(gather(ms.Tensor(np.array([n], np.int32))).asnumpy().min())
    return least


class SpmdCheck:
    """check(values, what): AllGathers a fixed-size int32 digest of `values` (one compiled graph)
    and raises AssertionError on every rank when the ranks' digests differ."""

    def __init__(self):
        import mindspore as ms
        self._ms = ms
        self._gather, self.rank, self.world = _tp_all_gather()
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
