"""ms-atb-generate's output: one writer per file (OutputLock) and the ids already written (done_ids, done_index).

Rules:
  1. One job writes an output file at a time, whatever path names it. A job holds an exclusive flock on the
     side file `<real path>.lock` (the output's path with every symbolic link resolved) from before it reads,
     truncates or opens the output until it exits, and an exclusive flock on the output file itself (its inode,
     so a hard link is the same file) while that exists; a second job fails at once.
  2. A data-parallel job is one job: its rank 0 takes the lock, writes the job's name (msrun's scheduler address)
     in it and shares it; each replica's writer joins by taking a shared lock on a file that names its own job,
     and rank 0 keeps its share until every replica has joined. Another job's exclusive lock fails while any
     holds a share.
  3. The lock file's content (the holder's pid and host) is informative; the kernel drops a flock when its holder
     dies, so a lock file left by a killed job does not block the next one. The last holder deletes it while
     still holding it; a job that locked a file deleted meanwhile retries on the new one.
  4. Side files (`.lock`, `.merging`) are created without following a symbolic link, and one that is a link, not
     a regular file of this user's, or has another name is refused, never truncated.
  5. Ids keep their JSON type: 7 and "7" are different ids. An OpenAI batch line's id is its custom_id.
  6. Resuming reads the output's result lines. Only a last line that does not parse (torn by a kill mid-write,
     starting like one of our lines) is cut; a complete last line that lost only its newline gets it back; any
     other line that is not a result is an error, so results, and files that are not ours, are never cut.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import time

from ms_atb.batch import json_line
from ms_atb.batch.id_index import IdIndex
from ms_atb.batch.openai_batch import result_key
from ms_atb.batch.prompt_file import is_id

RESULT_START = b'{"id": '     # how every line ms-atb-generate writes begins, in either format
JOIN_TIMEOUT_S = 300.0        # how long a replica waits for its rank 0 to take the lock (rule 2)


class OutputLock:
    """The lock of one output path (rules 1-3); ValueError naming the holder when another job has it. job: the
    data-parallel job this process's rank 0 owns (share() then lets its replicas join). A context manager;
    release() is idempotent."""

    def __init__(self, output: str, job: str | None = None):
        self.output = output
        self.path = os.path.realpath(output) + ".lock"
        self._fd = self._file_fd = None
        self._shared = False
        self._fd = self._acquire(fcntl.LOCK_EX)
        if self.path != output:
            try:
                os.ftruncate(self._fd, 0)
                os.write(self._fd, f"pid {os.getpid()} on {socket.gethostname()}{f' (job {job})' if job else ''}\n"
                         .encode())
            except OSError as e:
                self.release()
                raise ValueError(f"--output {output!r}: cannot write its lock file {self.path} ({e.strerror})") \
                    from None
        if os.path.exists(output):
            self.adopt(output)

    def _acquire(self, mode: int, busy_ok: bool = False) -> int | None:
        """The lock file's fd, flocked in mode (rule 3's retry); busy_ok: None when another holds it."""
        for _ in range(10):
            fd = self._open()
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except OSError as e:
                holder = _read_holder(fd)
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                    raise ValueError(f"--output {self.output!r}: cannot lock {self.path} ({e.strerror})") from None
                if busy_ok:
                    return None
                raise ValueError(f"--output {self.output!r} is being written by another ms-atb-generate job "
                                 f"({holder}; lock file {self.path}); wait for it to finish or stop it, "
                                 f"then rerun (with --resume to continue its results)") from None
            if self.path == self.output or _same_file(fd, self.path):   # the output itself: its folder is read-only
                return fd
            os.close(fd)
        raise ValueError(f"--output {self.output!r}: could not lock {self.path}: it keeps being replaced")

    def _open(self) -> int:
        try:
            return open_side_file(self.path)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EROFS, errno.EPERM) and os.path.exists(self.output):
                self.path = self.output         # no lock file can be made beside it: lock the output itself
                return os.open(self.output, os.O_RDONLY | os.O_CLOEXEC)
            raise ValueError(f"--output {self.output!r}: cannot create its lock file {self.path} "
                             f"({e.strerror})") from None

    def adopt(self, path: str) -> None:
        """Locks the output file itself, just created or found (rule 1: another name of the same file)."""
        if self._file_fd is not None:
            os.close(self._file_fd)
            self._file_fd = None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return                              # unreadable: the side lock is what there is
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self._shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ValueError(f"--output {self.output!r} is being written by another ms-atb-generate job under "
                             f"another name (a link to the same file); wait for it to finish") from None
        self._file_fd = fd

    def share(self, num_replicas: int) -> None:
        """Rank 0 of a data-parallel job: the lock becomes shared so that the job's replicas join (rule 2);
        release() then waits until num_replicas - 1 of them have."""
        self._replicas = num_replicas
        fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)     # not atomic: a job that got in meanwhile wins
        self._shared = True
        if self._file_fd is not None:
            fcntl.flock(self._file_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)

    @classmethod
    def join(cls, output: str, job: str, replica: int, timeout: float = JOIN_TIMEOUT_S) -> "OutputLock":
        """A replica's writer joins its job's lock (rule 2); ValueError when another job holds it."""
        lock = cls.__new__(cls)
        lock.output, lock.path, lock._file_fd, lock._shared = output, os.path.realpath(output) + ".lock", None, True
        end = time.monotonic() + timeout
        while True:
            lock._fd = lock._acquire(fcntl.LOCK_SH, busy_ok=True)    # None: rank 0 (or another job) holds it alone
            if lock._fd is not None:
                if f"(job {job})" in _read_holder(lock._fd).partition("\n")[0]:
                    break
                os.close(lock._fd)
            if time.monotonic() > end:
                raise ValueError(f"--output {output!r}: this job's rank 0 did not take its lock {lock.path} within "
                                 f"{timeout:.0f} s (another job may be writing it)")
            time.sleep(0.05)
        os.lseek(lock._fd, 0, os.SEEK_END)
        os.write(lock._fd, f"replica {replica} pid {os.getpid()}\n".encode())
        if os.path.exists(output):
            lock.adopt(output)
        return lock

    def release(self) -> None:
        if self._fd is None:
            return
        if self._shared and getattr(self, "_replicas", 1) > 1:
            self._wait_for_replicas()
        if self._file_fd is not None:
            os.close(self._file_fd)
            self._file_fd = None
        if self.path != self.output:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)     # the last holder (rule 3)
                os.unlink(self.path)
            except OSError:
                pass
        os.close(self._fd)                      # drops the flock
        self._fd = None

    def _wait_for_replicas(self) -> None:
        end = time.monotonic() + JOIN_TIMEOUT_S
        while time.monotonic() < end:
            joined = _read_holder(self._fd, 1 << 16).count("\nreplica ")
            if joined >= self._replicas - 1:
                return
            time.sleep(0.05)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def open_side_file(path: str, exclusive: bool = False) -> int:
    """A side file's fd, read-write, created if missing (rule 4); exclusive: it must not exist yet (O_EXCL).
    OSError as the system gives it; ValueError for a link, or a file that is not ours."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_EXCL if exclusive else 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(f"{path} is a symbolic link; ms-atb-generate makes its side files itself and never "
                             f"writes through a link: remove it") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
        os.close(fd)
        raise ValueError(f"{path} is not a side file of this job's (a regular file of this user's with no other "
                         f"name); remove it")
    return fd


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    own = os.fstat(fd)
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)


def _read_holder(fd: int, size: int = 200) -> str:
    try:
        text = os.pread(fd, size, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"


def done_ids(path: str) -> set:
    """The ids already written in an output file (rule 6), as a set (done_index() for a large one)."""
    ids = set()
    _scan(path, lambda rid, offset: ids.add(rid))
    return ids


def done_index(path: str, index: IdIndex | None = None) -> IdIndex:
    """done_ids() in flat memory: the ids of path added to index (a new one by default), each with its line's
    byte offset. The caller freezes it."""
    index = IdIndex() if index is None else index
    _scan(path, index.add)
    return index


def _scan(path: str, found) -> None:
    """Calls found(id, byte offset) for each result line of path; repairs its end (rule 6)."""
    if not os.path.exists(path):
        return
    size = os.path.getsize(path)
    good, last = 0, b""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            last = raw
            if raw.strip():
                rid = result_id(raw)
                if rid is None:
                    if not _torn(raw, good + len(raw) == size):
                        raise ValueError(f"--output {path}:{lineno} is not a result line (JSON with an 'id' and "
                                         f"'token_ids', 'text' or 'error', or an OpenAI batch line with "
                                         f"'custom_id', 'response' and 'error'); fix or remove it, or pass "
                                         f"--overwrite")
                    break
                found(rid, good)
            good += len(raw)
    try:
        if good < size:
            with open(path, "r+b") as f:
                f.truncate(good)
        elif last and not last.endswith(b"\n"):
            with open(path, "ab") as f:
                f.write(b"\n")
    except OSError as e:
        raise ValueError(f"--output {path}: cannot repair its last line for --resume ({e.strerror})") from None


def _torn(raw: bytes, at_end: bool) -> bool:
    """A last line cut by a kill mid-write: no newline, does not parse, and starts like one of ours."""
    if not at_end or raw.endswith(b"\n") or not (raw.startswith(RESULT_START) or RESULT_START.startswith(raw)):
        return False
    try:
        json_line.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return True
    return False


def result_id(raw: bytes):
    """The id of a result line (a string or an integer; for an OpenAI batch line its custom_id, or ("line", N)
    for an error line without one), or None if the line is not one."""
    try:
        item = json_line.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    key = result_key(item)                    # an OpenAI batch line: its custom_id
    if key is not None:
        return key
    if isinstance(item, dict) and is_id(item.get("id")) and any(k in item for k in ("token_ids", "text", "error")):
        return item["id"]
    return None
