"""TierWriter: the disk tier's writer thread (ms_atb/worker/disk_tier.py). The step loop hands it copies of the
blocks a step computed and goes on; the thread writes them, never the step.

- A block already on disk is not written again: its file is touched (used last).
- Recency is a file's mtime, set by touch() as a block is written or read: now, less a microsecond per block
  before it in its prefix, so that a prefix's tail blocks look older than its head and go first (a tail without
  its head is never found), as the pool evicts a request's tail first.
- Each batch of new files is written holding `<dir>/lock` (fcntl.flock, released if the process dies; a batch
  that waits more than LOCK_TIMEOUT_S for it is dropped). `<dir>/usage` counts the bytes of the block files: a
  batch that fits the budget adds its bytes there before its files appear (a writer killed meanwhile leaves an
  over-count, never an under-count); one that does not fit lists `blocks/` (the true count, every process's files),
  removes the least recently used files until the directory is down to EVICT_TO of kv_cache.disk_cache_bytes less
  the batch (so that a listing is rare), and rewrites the count. Each file is written under a temporary name and
  renamed into place. A reader sees a whole block or none; the budget holds across every process using the
  directory. (A reader that removes a damaged file leaves the count high until the next listing: conservative.)
- The queue holds at most max_pending_bytes of blocks; past that a block is dropped (counted), not waited
  for. A write that fails (a full or read-only disk) drops its batch with a one-line warning.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np

from ms_atb.core.kv_tier import KVStore
from ms_atb.worker import kv_block_file

_STOP = object()
LOCK_TIMEOUT_S = 30.0
EVICT_TO = 0.9


class TierWriter:
    def __init__(self, folder: Path, key: bytes, identity: bytes, block_size: int, budget_bytes: int,
                 max_pending_bytes: int):
        self.folder, self.blocks, self.block_size = folder, folder / "blocks", block_size
        self._key, self._identity = key, identity
        self.budget_bytes, self.max_pending_bytes = budget_bytes, max_pending_bytes
        self.counters = dict(written_blocks=0, dropped_blocks=0, evicted_blocks=0)
        self._queue: queue.Queue = queue.Queue()
        self._pending = 0                       # bytes queued, not yet written
        self._lock = threading.Lock()           # guards _pending and counters between the two threads
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="ms_atb-disk-tier-writer", daemon=True)
        self._thread.start()

    def put(self, stores: list[KVStore], data: np.ndarray | None, used: list[tuple[bytes, int]] = ()) -> None:
        """Queues stores[i] with its bytes data[i] (uint8 [block_bytes]), dropping what does not fit the queue, and
        the (hash, depth) of blocks used from the pool, to be touched."""
        take = 0
        if stores:
            with self._lock:
                room = max(0, self.max_pending_bytes - self._pending) // max(data.shape[1], 1)
                take = min(len(stores), room)
                self.counters["dropped_blocks"] += len(stores) - take
                self._pending += take * data.shape[1]
        if take or used:
            self._queue.put((stores[:take], data[:take] if take else None, list(used)))

    def flush(self) -> None:
        if self._thread.is_alive():
            self._queue.join()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                self._queue.task_done()
                return
            batch = [item]
            while True:                          # what else is queued joins this batch: one lock, one listing
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    self._queue.put(_STOP)
                    self._queue.task_done()
                    break
                batch.append(more)
            try:
                self._write_batch(batch)
            except OSError as e:
                self._fail(batch, e)
            finally:
                with self._lock:
                    self._pending -= sum(data.nbytes for _, data, _ in batch if data is not None)
                for _ in batch:
                    self._queue.task_done()

    def _write_batch(self, batch: list) -> None:
        files, depths, now = self._new_files(batch)
        if files:
            self._write_files(files, depths, now)

    def _new_files(self, batch: list) -> tuple[dict, dict, int]:
        """The batch's blocks not on disk yet: {path: (header, data)} and {path: blocks before it}, and the time
        of this use; the files of the others, and of the blocks found in a pool, are touched."""
        files, depths = {}, {}
        touched = {}                             # path -> depth: files already there, used again
        for stores, data, used in batch:
            for h, depth in used:
                touched[self._path(h)] = depth
            for store, row in zip(stores, data if data is not None else ()):
                path = self._path(store.hash)
                if path in files:
                    continue
                if path.exists():
                    touched[path] = store.num_tokens // self.block_size - 1
                    continue
                tokens = np.asarray(store.token_ids[:store.num_tokens], np.int32)
                files[path] = (kv_block_file.header(self._identity, store.hash, store.extra_key, tokens, row,
                                                    self._key), row)
                depths[path] = store.num_tokens // self.block_size - 1
        now = time.time_ns()
        for path, depth in touched.items():
            _touch_path(path, depth, now)
        return files, depths, now

    def _write_files(self, files: dict, depths: dict, now: int) -> None:
        sizes = {path: len(head) + row.nbytes for path, (head, row) in files.items()}
        with _locked(self.folder / "lock") as locked:
            if not locked:
                raise OSError(f"{self.folder / 'lock'} stayed locked for {LOCK_TIMEOUT_S:.0f} s")
            total = self._read_usage()
            need = sum(sizes.values())
            if total is None or total + need > self.budget_bytes:
                total = self._evict(need)
            chosen = []
            for path in files:
                if total + sizes[path] <= self.budget_bytes:
                    chosen.append(path)
                    total += sizes[path]
            self._write_usage(total)             # before the files appear: a kill leaves an over-count
            for path in chosen:
                self._publish(path, *files[path], depths[path], now)
        with self._lock:
            self.counters["dropped_blocks"] += len(files) - len(chosen)

    def _path(self, block_hash: bytes) -> Path:
        return self.blocks / f"{block_hash.hex()}.kv"

    def _read_usage(self) -> int | None:
        try:
            return int((self.folder / "usage").read_text())
        except (OSError, ValueError):
            return None

    def _write_usage(self, total: int) -> None:
        tmp = self.folder / f"usage.{threading.get_ident()}.tmp-{os.getpid()}"
        tmp.write_text(str(total))
        os.replace(tmp, self.folder / "usage")

    def _evict(self, need: int) -> int:
        """Lists blocks/ (holding the lock) and, if `need` more bytes do not fit the budget, removes the least
        recently used files until they do with the directory at most EVICT_TO of the budget; returns the bytes
        left. Temporary files of dead processes go first."""
        from ms_atb.ops.trusted_cache import sweep_dead_temps
        sweep_dead_temps(self.blocks)
        sweep_dead_temps(self.folder)
        entries, total = [], 0
        with os.scandir(self.blocks) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                total += st.st_size
                if entry.name.endswith(".kv"):
                    entries.append((st.st_mtime_ns, st.st_size, entry.path))
        if total + need <= self.budget_bytes:
            return total
        target = min(self.budget_bytes - need, int(EVICT_TO * self.budget_bytes) - need)
        entries.sort()
        evicted = 0
        for _, size, path in entries:
            if total <= target:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            total -= size
            evicted += 1
        with self._lock:
            self.counters["evicted_blocks"] += evicted
        return total

    def _publish(self, path: Path, head: bytes, row: np.ndarray, depth: int, now: int) -> None:
        tmp = path.with_name(f"{path.stem}.{threading.get_ident()}.tmp-{os.getpid()}")
        try:
            kv_block_file.write(tmp, head, row)
            touch(tmp, depth, now)
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        with self._lock:
            self.counters["written_blocks"] += 1

    def _fail(self, batch: list, e: OSError) -> None:
        with self._lock:
            self.counters["dropped_blocks"] += sum(len(stores) for stores, _, _ in batch)
        if not self._warned:
            self._warned = True
            print(f"[ms_atb] warning: kv_cache.disk_cache_dir {self.folder}: a write failed ({e.strerror or e}); "
                  f"blocks that fail to write are recomputed when needed", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(path: Path):
    """Holds an exclusive flock on path; yields False if it could not within LOCK_TIMEOUT_S."""
    with open(path, "a") as f:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(0.005)
        yield True                               # released as the file closes


def touch(file, depth: int, now: int) -> None:
    """Marks a block file (a path or an open descriptor) used at `now` (time.time_ns(), one value for the blocks
    of one use); depth: the blocks before it in its prefix."""
    os.utime(file, ns=(now, now - 1000 * depth))


def _touch_path(path: Path, depth: int, now: int) -> None:
    try:
        touch(path, depth, now)
    except FileNotFoundError:
        pass
