"""GraphCache: keeps the engine's compiled graphs on disk between runs (context.compile_cache).

MindSpore's compile cache (MS_COMPILER_CACHE_ENABLE=1, MS_COMPILER_CACHE_PATH=dir) saves
each graph compiled while it is on as `compile_cache_<N>.mindir`, N counting the graphs compiled so
far in the process, and a later process loads graph N in place of compiling it. It checks neither the
input shapes nor the model, and the path is fixed by the first graph compiled with it on. So:
- one directory per key, which hashes everything a graph depends on: ms_atb's sources and kernel
  library, MindSpore's version, the model file(s) (path, size, mtime), the model shape, dtype,
  device, pool and step sizes, buckets and rank, and the entry script (which MindSpore hashes too);
- the cache is on only while one engine compiles its buckets, always in the same order, and only
  for the first engine in a process that asks for it (later ones compile as usual);
- a new directory is written under a temporary name and renamed into place when the whole warmup
  succeeded, so a killed run or a racing process never leaves a partial cache behind;
- a cache that fails to load is removed and the graphs are compiled afresh;
- trust (ops/trusted_cache.py): the root must be the user's own and closed to others' writes
  (else a ValueError), and a directory is loaded only if the sha256 over its files is the one
  recorded (`<key>.sha256` beside it) when it was saved; any other is removed and compiled afresh.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from ms_atb.ops.trusted_cache import forget, private_dir, record_digest, recorded_digest, tree_digest

FORMAT = 1                # bump when the layout or the key changes
_PACKAGES = ("ms_atb", "ms_atb.models", "ms_atb.ops")
_SOURCE_SUFFIXES = (".py", ".cc", ".h")
_claimed_by_pid: int | None = None      # MindSpore keeps one cache path per process
_ENV = ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH")    # read by MindSpore at each compile


def sources_digest() -> str:
    """sha256 over ms_atb's Python and C++ sources (the model, the runner, the kernels), every
    sub-package at any depth included."""
    import importlib
    h = hashlib.sha256()
    for package in _PACKAGES:
        root = Path(importlib.import_module(package).__file__).resolve().parent
        for path in sorted(root.rglob("*")):
            if path.suffix in _SOURCE_SUFFIXES and "__pycache__" not in path.parts:
                name = path.relative_to(root).as_posix()
                h.update(f"{package}/{name}\0".encode() + path.read_bytes() + b"\0")
    return h.hexdigest()


def files_identity(path: str) -> list:
    """(name, size, mtime_ns) of a model file, or of every file in a model directory; the string itself
    for in-memory models (random:...)."""
    if not os.path.exists(path):
        return [path]
    paths = [path] if os.path.isfile(path) else sorted(
        os.path.join(path, n) for n in os.listdir(path) if os.path.isfile(os.path.join(path, n)))
    return [(os.path.abspath(p), os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in paths]


def cache_key(parts: dict) -> str:
    import mindspore as ms
    full = {"format": FORMAT, "mindspore": ms.__version__, "python": sys.version,
            "sources": sources_digest(), **parts}
    return hashlib.sha256(json.dumps(full, sort_keys=True, default=str).encode()).hexdigest()[:32]


def sweep_dead_temps(root: Path) -> None:
    """Removes the temporary folders of processes that died while saving (killed during warmup): no one
    would ever rename or remove them. A folder is named <key>.tmp-<pid>; a live pid's folder stays."""
    for tmp in root.glob("*.tmp-*"):
        pid = tmp.name.rpartition(".tmp-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):   # another user's process, or not a pid this OS could have
        return True
    return True


class GraphCache:
    """Wraps one engine's warmup: `with GraphCache(root, parts) as cache: compile every bucket`.

    `status` after the block: "off" (no root), "loaded", "saved", "skipped" (an earlier engine of
    this process holds MindSpore's one cache path) or "unavailable" (`python -c`: MindSpore hashes the
    entry script, and there is none); the last two compile as usual."""

    def __init__(self, root: str | None, parts: dict):
        self.root = None if not root else Path(os.path.expanduser(root)).resolve()
        self.parts = parts
        self.status = "off"
        self.path: Path | None = None
        self._tmp: Path | None = None

    def __enter__(self) -> "GraphCache":
        global _claimed_by_pid
        if self.root is None:
            return self
        if _claimed_by_pid == os.getpid():
            self.status = "skipped"
            return self
        if sys.argv and sys.argv[0] and not os.path.isfile(os.path.realpath(sys.argv[0])):
            self.status = "unavailable"          # `python -c`: MindSpore hashes the entry script; none here
            return self
        # MindSpore also hashes the entry script and recompiles in place when it changed: one directory
        # per script keeps two programs from overwriting each other's graphs.
        entry = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
        private_dir(self.root, "context.compile_cache")
        self.path = self.root / cache_key({**self.parts, "entry_script": entry})
        if self.path.is_dir() and not os.path.islink(self.path) \
                and recorded_digest(self.path) == tree_digest(self.path):
            self.status, target = "loaded", self.path
        else:
            shutil.rmtree(self.path, ignore_errors=True)      # unrecorded or changed since it was saved
            forget(self.path)
            sweep_dead_temps(self.root)
            self._tmp = target = self.root / f"{self.path.name}.tmp-{os.getpid()}"
            shutil.rmtree(target, ignore_errors=True)
            self.status = "saved"
        _claimed_by_pid = os.getpid()
        self._saved_env = {k: os.environ.get(k) for k in _ENV}
        os.environ.update(zip(_ENV, ("1", str(target))))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.status in ("off", "skipped", "unavailable"):
            return False
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if self._tmp is not None:
            if exc_type is None and not self.path.exists():
                digest = tree_digest(self._tmp)
                try:
                    os.rename(self._tmp, self.path)
                    if digest is not None:
                        record_digest(self.path, digest)
                except OSError:                  # another process renamed its copy first
                    pass
            shutil.rmtree(self._tmp, ignore_errors=True)
        elif exc_type is not None:                # a cache that failed to load: remove it
            shutil.rmtree(self.path, ignore_errors=True)
            forget(self.path)
        return False
