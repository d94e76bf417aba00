"""ms-atb-generate's output: one writer per file (OutputLock) and the ids already written (done_ids).

Rules:
  1. One job writes an output at a time. A job holds an exclusive flock on `<output>.lock` from before it
     reads, truncates or opens the output until it exits; a second job on the same output fails at once.
  2. The lock file's content (the holder's pid and host) is only informative: the kernel drops a flock
     when its holder dies, so a lock file left by a killed job does not block the next one.
  3. The holder deletes the lock file while still holding it; a job that locked a file that was deleted
     meanwhile retries on the new one, so two jobs never hold locks on different files of one path.
  4. Ids keep their JSON type: 7 and "7" are different ids. An OpenAI batch line's id is its custom_id.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket

from ms_atb.batch.openai_batch import result_key
from ms_atb.batch.prompt_file import is_id

RESULT_START = b'{"id": '     # how every line ms-atb-generate writes begins, in either format


class OutputLock:
    """Exclusive, non-blocking lock of one output path; ValueError naming the holder when another job has it.
    A context manager; release() is idempotent."""

    def __init__(self, output: str):
        self.output = output
        self.path = output + ".lock"
        self._fd = None
        for _ in range(10):                     # rule 3: the file may be deleted between open and flock
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _read_holder(fd)
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                    raise ValueError(f"--output {output!r}: cannot lock {self.path} ({e.strerror})") from None
                raise ValueError(f"--output {output!r} is being written by another ms-atb-generate job "
                                 f"({holder}; lock file {self.path}); wait for it to finish or stop it, "
                                 f"then rerun (with --resume to continue its results)") from None
            if self.path == output or _same_file(fd, self.path):    # the output itself: its folder is read-only
                break
            os.close(fd)
        else:
            raise ValueError(f"--output {output!r}: could not lock {self.path}: it keeps being replaced")
        self._fd = fd
        if self.path != output:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EROFS, errno.EPERM) and os.path.exists(self.output):
                self.path = self.output         # no lock file can be made beside it: lock the output itself
                return os.open(self.output, os.O_RDONLY)
            raise ValueError(f"--output {self.output!r}: cannot create its lock file {self.path} "
                             f"({e.strerror})") from None

    def release(self) -> None:
        if self._fd is None:
            return
        if self.path != self.output:
            try:
                os.unlink(self.path)            # rule 3: deleted while still held
            except OSError:
                pass
        os.close(self._fd)                      # drops the flock
        self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    own = os.fstat(fd)
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"


def done_ids(path: str) -> set:
    """Ids already written: lines with an id and a result (token_ids, text) or an error (OpenAI batch lines:
    their custom_id). A torn last line (the run was killed mid-write: no newline, and the start of a result
    line) is cut off, and a complete last line that lost only its newline gets it back. Any other line that is
    not a result is an error, so results, and files that are not ours, are never truncated away."""
    if not os.path.exists(path):
        return set()
    size = os.path.getsize(path)
    ids, good, last = set(), 0, b""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            last = raw
            if raw.strip():
                rid = result_id(raw)
                if rid is None:
                    torn = (good + len(raw) == size and not raw.endswith(b"\n")
                            and (raw.startswith(RESULT_START) or RESULT_START.startswith(raw)))
                    if not torn:
                        raise ValueError(f"--output {path}:{lineno} is not a result line (JSON with an 'id' and "
                                         f"'token_ids', 'text' or 'error', or an OpenAI batch line with "
                                         f"'custom_id', 'response' and 'error'); fix or remove it, or pass "
                                         f"--overwrite")
                    break
                ids.add(rid)
            good += len(raw)
    if good < size:
        with open(path, "r+b") as f:
            f.truncate(good)
    elif last and not last.endswith(b"\n"):
        with open(path, "ab") as f:
            f.write(b"\n")
    return ids


def result_id(raw: bytes):
    """The id of a result line (a string or an integer; for an OpenAI batch line its custom_id, or ("line", N)
    for an error line without one), or None if the line is not one."""
    try:
        item = json.loads(raw)
    except ValueError:
        return None
    key = result_key(item)                    # an OpenAI batch line: its custom_id
    if key is not None:
        return key
    if isinstance(item, dict) and is_id(item.get("id")) and any(k in item for k in ("token_ids", "text", "error")):
        return item["id"]
    return None
