"""GraphCache: keeps the engine's compiled graphs on disk between runs (context.compile_cache), one bucket
at a time, as the run first needs it.

MindSpore's compile cache (MS_COMPILER_CACHE_ENABLE=1, MS_COMPILER_CACHE_PATH=dir) saves each graph compiled
while it is on as `compile_cache_<N>.mindir`, N counting the graphs compiled with it on so far in the process,
and a later process loads graph N in place of compiling its N-th graph. It checks neither the input shapes nor
the model, and the path is fixed by the first graph compiled with it on. So:
- one directory per key, which hashes everything a graph depends on: ms_atb's sources and kernel
  library, MindSpore's version, the model file(s) (path, size, mtime), the model shape, dtype,
  device, pool and step sizes, buckets and rank, and the entry script's path and content (MindSpore
  hashes the script too);
- the directory records the bucket of each N (`buckets.json`, in compile order). The cache is on only
  while this engine compiles a bucket, and only for the first engine in a process that asks for it
  (later ones compile as usual). A bucket recorded at N loads after graphs 0..N-1 have loaded, so a
  bucket needed out of the recorded order first loads the recorded ones before it (a load costs a
  fraction of a compile); a bucket not recorded loads every recorded graph, then compiles as graph
  N = len(buckets) and is appended;
- the process works in a private copy (`<key>.tmp-<pid>`, MindSpore's fixed path); after each new
  graph the copy is published as a whole: written under a temporary name, its digest recorded, and
  renamed into place, so a killed run or a racing process never leaves a partial cache behind;
- a cache that fails to load is removed and the bucket is compiled afresh, without a cache for the
  rest of the process;
- trust (ops/trusted_cache.py): the root must be the user's own and closed to others' writes
  (else a ValueError), and a directory is loaded only if the sha256 over its files is the one
  recorded (`<key>.sha256` beside it) when it was saved; any other is removed and compiled afresh.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from ms_atb.ops.trusted_cache import forget, private_dir, record_digest, recorded_digest, tree_digest

FORMAT = 2                # bump when the layout or the key changes
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


def cache_root(setting: str | None) -> str | None:
    """context.compile_cache as a directory (graphs in it, weights in its `weights/` folder): "auto" is
    default_root(), None (or "off" through $MS_ATB_GRAPH_CACHE) is no cache."""
    return default_root() if setting == "auto" else setting


def default_root() -> str | None:
    """Where context.compile_cache "auto" keeps graphs: $MS_ATB_GRAPH_CACHE ("off": nowhere), else
    $XDG_CACHE_HOME/ms_atb/graphs (~/.cache/ms_atb/graphs)."""
    env = os.environ.get("MS_ATB_GRAPH_CACHE")
    if env:
        return None if env == "off" else env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ms_atb", "graphs")


def sweep_dead_temps(root: Path) -> None:
    """Removes the folders and files of processes that died while working or publishing: no one would ever
    rename or remove them. One is named <name>.<tmp|pub|old>-<pid>; a live pid's stays."""
    for kind in ("tmp", "pub", "old"):
        for tmp in root.glob(f"*.{kind}-*"):
            pid = tmp.name.rpartition(f".{kind}-")[2]
            if pid.isdigit() and not _alive(int(pid)):
                if tmp.is_dir() and not tmp.is_symlink():
                    shutil.rmtree(tmp, ignore_errors=True)
                else:
                    tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):   # another user's process, or not a pid this OS could have
        return True
    return True


def _copy_tree(src: Path, dst: Path) -> None:
    """dst: a copy of src; graphs are hard-linked (MindSpore writes each `compile_cache_<N>.mindir` once),
    every other file is copied (MindSpore may rewrite it in place)."""
    for path in sorted(src.rglob("*")):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(mode=0o700, parents=True, exist_ok=True)
            continue
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            if path.suffix != ".mindir":
                raise OSError("copied")
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)


MANIFEST = "buckets.json"


class GraphCache:
    """One engine's graphs: `cache.open()` at build, then `cache.ensure(bucket, compile_one)` before a bucket
    first runs; compile_one(bucket) compiles (or, with the cache on, loads) that bucket's graph.

    `status`: "off" (no root), "skipped" (an earlier engine of this process holds MindSpore's one cache
    path), "unavailable" (`python -c`: MindSpore hashes the entry script, and there is none), "failed (...)"
    (a cache that did not load, removed; compiling as usual), else "loaded" (every graph came from the
    cache), "saved" (at least one was compiled and published) or "empty" (no graph needed yet)."""

    def __init__(self, root: str | None, parts: dict):
        self.root = None if not root else Path(os.path.expanduser(root)).resolve()
        self.parts = parts
        self.path: Path | None = None
        self.recorded: list[int] = []       # the bucket of each N in the published cache
        self.used = 0                       # graphs compiled or loaded with the cache on in this process
        self.loaded = self.saved = 0
        self._state = "off"
        self._work: Path | None = None

    @property
    def status(self) -> str:
        if self._state != "on":
            return self._state
        return "saved" if self.saved else "loaded" if self.loaded else "empty"

    def open(self) -> "GraphCache":
        global _claimed_by_pid
        if self.root is None:
            return self
        if _claimed_by_pid == os.getpid():
            self._state = "skipped"
            return self
        entry = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
        if not entry or not os.path.isfile(entry):
            self._state = "unavailable"          # `python -c`: MindSpore hashes the entry script; none here
            return self
        # MindSpore recompiles in place when the entry script changed: one directory per script and content.
        with open(entry, "rb") as f:
            script = hashlib.sha256(f.read()).hexdigest()
        private_dir(self.root, "context.compile_cache")
        self.path = self.root / cache_key({**self.parts, "entry_script": [entry, script]})
        sweep_dead_temps(self.root)
        self._work = self.root / f"{self.path.name}.tmp-{os.getpid()}"
        shutil.rmtree(self._work, ignore_errors=True)
        self._work.mkdir(mode=0o700)
        atexit.register(shutil.rmtree, self._work, True)
        if self.path.is_dir() and not os.path.islink(self.path) \
                and recorded_digest(self.path) == tree_digest(self.path):
            _copy_tree(self.path, self._work)
            self.recorded = self._read_manifest(self._work)
        else:                                  # unrecorded or changed since it was saved
            shutil.rmtree(self.path, ignore_errors=True)
            forget(self.path)
        _claimed_by_pid = os.getpid()
        self._state = "on"
        return self

    @staticmethod
    def _read_manifest(folder: Path) -> list[int]:
        try:
            buckets = json.loads((folder / MANIFEST).read_text())
        except (OSError, ValueError):
            return []
        ok = isinstance(buckets, list) and all(isinstance(b, int) for b in buckets) and len(set(buckets)) == len(buckets)
        return buckets if ok else []

    def ensure(self, bucket: int, compile_one) -> None:
        """Makes `bucket`'s graph ready through compile_one, with the cache on when it is in use (loading the
        recorded graphs before it first, see the module docstring)."""
        if self._state != "on":
            compile_one(bucket)
            return
        pending = self.recorded[self.used:]
        todo = pending[:pending.index(bucket) + 1] if bucket in pending else pending + [bucket]
        for b in todo:
            new = self.used >= len(self.recorded)
            try:
                self._with_cache(compile_one, b)
            except Exception as e:
                self._fail(e)
                compile_one(bucket)             # without the cache; a second failure is the caller's
                return
            self.used += 1
            if new:
                self.recorded.append(b)
                self.saved += 1
                self._publish()
            else:
                self.loaded += 1

    def _with_cache(self, compile_one, bucket: int) -> None:
        saved = {k: os.environ.get(k) for k in _ENV}
        os.environ.update(zip(_ENV, ("1", str(self._work))))
        try:
            compile_one(bucket)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def _fail(self, e: Exception) -> None:
        """A cache that does not load (or save) is removed; the process compiles without one from here."""
        first = str(e).splitlines()[0] if str(e) else ""
        self._state = f"failed ({type(e).__name__}: {first}), not used"
        shutil.rmtree(self.path, ignore_errors=True)
        forget(self.path)

    def _publish(self) -> None:
        """The working copy, with its manifest, renamed into place as the key's directory."""
        (self._work / MANIFEST).write_text(json.dumps(self.recorded))
        pub = self.root / f"{self.path.name}.pub-{os.getpid()}"
        old = self.root / f"{self.path.name}.old-{os.getpid()}"
        shutil.rmtree(pub, ignore_errors=True)
        pub.mkdir(mode=0o700)
        _copy_tree(self._work, pub)
        digest = tree_digest(pub)
        try:
            if digest is None or len(self._read_manifest(self.path)) > len(self.recorded):
                return                           # another process published more graphs: keep theirs
            if self.path.exists():
                os.rename(self.path, old)
            os.rename(pub, self.path)
            record_digest(self.path, digest)
        except OSError:                          # another process renamed its copy first
            pass
        finally:
            shutil.rmtree(pub, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)
