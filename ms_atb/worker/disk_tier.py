"""DiskTier: a persistent prefix tier of the KV cache on disk (kv_cache.disk_cache_dir), shared by every process
that names the directory: later jobs, a job resumed after a kill, the replicas of a data-parallel job.

The directory holds `key` (32 random bytes, written once, atomically), `lock` (the writers' lock) and
`blocks/`, one file per block named by its chained hash (ms_atb/worker/kv_block_file.py gives the layout).
- Identity. The pool's chained, keyed hashes name the files: the key is the directory's, so every process
  hashes a prefix alike, and the chain's root mixes in `hash_root`, a digest of everything the KV bytes depend
  on (the model's files and config, dtype, cache dtype, block size, tensor-parallel degree and rank, weight
  and activation formats, attention backend, ms_atb's sources and kernels, MindSpore's version). An engine that
  would write other bytes looks up other names: a miss, never a wrong answer. A request's extra key (an
  adapter's name) joins the root too (ms_atb/core/prefix_cache.py).
- Reads. A prompt's leading blocks that miss the pool are read here while the scheduler admits it (fetch):
  each file is checked (length, MAC under the directory's key, CRC-32, identity, hash, extra key, every token
  of the prefix) before its bytes are staged; a file that fails is a miss with a one-line warning and is
  removed. The step copies staged blocks into the pool before its graph runs (load_into).
- Writes. After a step, the blocks it computed are copied out of the pool (store_from: a memory copy) and
  handed to a writer thread (ms_atb/worker/tier_writer.py): the step never waits on disk. A file appears
  atomically (written under a temporary name, then renamed); writers hold `lock` while they make room under
  kv_cache.disk_cache_bytes (the least recently used files go first, whichever process wrote them: a hit
  touches its file) and publish, so the budget holds across processes. Pending writes are flushed at exit.
- Trust: the directory follows rule 1 of ops/trusted_cache.py (the user's own, closed to others' writes),
  else a ValueError naming it.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np

from ms_atb.core.kv_tier import KVLoad, KVStore
from ms_atb.worker import kv_block_file
from ms_atb.worker.tier_writer import TierWriter, touch

KEY_BYTES = 32
SETTING = "kv_cache.disk_cache_dir"


def open_dir(path: str) -> Path:
    """The tier's directory (created 0700 if missing) with its `blocks/` folder; ValueError naming it unless it
    is the user's own and closed to group and others' writes."""
    from ms_atb.ops.trusted_cache import private_dir
    folder = private_dir(Path(os.path.expanduser(path)), SETTING)
    private_dir(folder / "blocks", SETTING)
    return folder


def read_key(folder: Path) -> bytes:
    """The directory's key, written once by whichever process comes first (a link: never half a key)."""
    path = folder / "key"
    if not path.exists():
        tmp = folder / f"key.{threading.get_ident()}.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, os.urandom(KEY_BYTES))
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise ValueError(f"{SETTING} {str(folder)!r}: {path} holds {len(key)} bytes, not a key ms_atb wrote "
                         f"({KEY_BYTES} bytes); remove the directory or name another")
    return key


class DiskTier:
    """The tier one engine uses: fetch() for the block manager (ms_atb/core/kv_tier.py), load_into() and
    store_from() for the model runner's steps, flush() and close() for the end of the process."""

    def __init__(self, path: str, budget_bytes: int, identity: bytes, block_size: int, block_bytes: int,
                 agree=None, max_pending_bytes: int = 256 << 20):
        """identity: 16 bytes, the digest of what the KV bytes depend on; block_bytes: a block's bytes on this
        rank (KVPool.block_bytes); agree(n) -> the least n of all tensor-parallel ranks (None: one rank)."""
        assert len(identity) == 16
        self.folder = open_dir(path)
        self.blocks = self.folder / "blocks"
        self.hash_key = read_key(self.folder)
        self.hash_root = identity
        self.block_size, self.block_bytes = block_size, block_bytes
        self._agree = agree
        self._staged: dict[bytes, np.ndarray] = {}
        self.counters = dict(read_blocks=0, damaged_blocks=0)
        self.writer = TierWriter(self.folder, self.hash_key, identity, block_size, budget_bytes,
                                 min(max_pending_bytes, budget_bytes))
        atexit.register(_close, weakref.ref(self))

    def path(self, block_hash: bytes) -> Path:
        return self.blocks / f"{block_hash.hex()}.kv"

    # ---- reads: the block manager's fetch, then the step's loads -----------------------------------
    def fetch(self, token_ids: list[int], extra_key: str | None, first: int, hashes: list[bytes]) -> int:
        tokens = np.asarray(token_ids, np.int64)
        bs, num, now = self.block_size, 0, time.time_ns()
        for i, h in enumerate(hashes):
            data = self._read(h, tokens[:(first + i + 1) * bs], extra_key, first + i, now)
            if data is None:
                break
            self._staged[h] = data
            num += 1
        if self._agree is not None:
            num = self._agree(num)
        for h in hashes[num:]:
            self._staged.pop(h, None)
        self.counters["read_blocks"] += num
        return num

    def _read(self, h: bytes, tokens: np.ndarray, extra_key: str | None, depth: int, now: int) -> np.ndarray | None:
        """The data of block h (depth blocks after the root) when its file is sound and holds exactly these
        tokens, marked used at `now`; None otherwise."""
        path = self.path(h)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return None
        except OSError as e:
            self._damaged(path, f"cannot be opened ({e.strerror})")
            return None
        try:
            data, fields = kv_block_file.read(fd, os.fstat(fd).st_size, self.hash_key, self.block_bytes)
            if fields["identity"] != self.hash_root or fields["hash"] != h:
                raise kv_block_file.Damaged("written for another engine or block than its name says")
            if fields["extra_key"] != extra_key or not np.array_equal(fields["token_ids"], tokens):
                return None                # another prefix under a colliding name: a plain miss, kept
            touch(fd, depth, now)          # used last: kept longest by the budget's eviction
        except kv_block_file.Damaged as e:
            self._damaged(path, str(e))
            return None
        except OSError as e:
            self._damaged(path, f"cannot be read ({e.strerror})")
            return None
        finally:
            os.close(fd)
        return data

    def _damaged(self, path: Path, why: str) -> None:
        self.counters["damaged_blocks"] += 1
        try:
            path.unlink()
        except OSError:
            pass
        print(f"[ms_atb] warning: {SETTING}: block file {path}: {why}; removed, the block is computed instead",
              file=sys.stderr, flush=True)

    def load_into(self, pool, loads: list[KVLoad]) -> None:
        """Copies the staged blocks of a step's loads into the pool; what else was staged is dropped."""
        for load in loads:
            pool.write(load.block, self._staged[load.hash])
        self._staged.clear()

    # ---- writes ----------------------------------------------------------------------------------
    def store_from(self, pool, stores: list[KVStore], used: list[tuple[bytes, int]] = ()) -> None:
        """Hands the writer thread copies of the blocks a step computed, and the (hash, depth) of the blocks its
        requests found in the pool (their files, if any, are marked used)."""
        if stores or used:
            self.writer.put(stores, pool.read([s.block for s in stores]) if stores else None, used)

    def flush(self) -> None:
        """Returns once every block handed to the writer is on disk (or dropped)."""
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def stats(self) -> dict:
        w = self.writer.counters
        return {"disk_cache_read_blocks": self.counters["read_blocks"],
                "disk_cache_damaged_blocks": self.counters["damaged_blocks"],
                "disk_cache_written_blocks": w["written_blocks"],
                "disk_cache_dropped_blocks": w["dropped_blocks"],
                "disk_cache_evicted_blocks": w["evicted_blocks"]}


def _close(ref) -> None:
    """At exit: the tier's pending writes reach the disk."""
    tier = ref()
    if tier is not None:
        tier.close()
