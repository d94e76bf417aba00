"""The trust rule of on-disk caches that hold code (the kernel library, compiled graphs).

A cached artifact is loaded only when both hold:
  1. its directory is owned by the current user (st_uid == os.geteuid()) and writable by no one else
     (no group or other write bit); a directory this process creates gets mode 0o700. Another user
     who could write there could plant a library whose name (the cache key) anyone can compute.
  2. its sha256 equals the digest recorded when it was built: `<artifact>.sha256` beside it, written
     atomically (temporary file, then rename) once the artifact is complete.
An artifact failing rule 2 is rebuilt. A directory failing rule 1 is refused with a ValueError that
says why and what to do: nothing in it is loaded, and nothing is built there.

What is loaded is what was checked: an artifact is read once, never through a link, its digest taken over
the bytes read, and those same bytes are what the process loads (a library: a copy written from them,
load_library; a graph directory: a private copy written as it is hashed, tree_digest(copy_to=...)). A file
swapped in after the check is never loaded.

Temporaries carry the pid of the process writing them (`<name>.tmp-<pid>...`, also `.pub-` and `.old-`);
sweep_dead_temps removes those of dead processes, links and files included, never following a link.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

_TEMP_NAME = re.compile(r"\.(?:tmp|pub|old)-(\d+)(?:[-.].*)?$")    # <name>.tmp-<pid>, then anything
_LOADED: dict = {}      # path -> ctypes.CDLL of every library loaded by load_library, held for the process's life


def private_dir(path, what: str) -> Path:
    """`path`, created with mode 0o700 if missing; ValueError unless it passes rule 1."""
    path = Path(path)
    try:
        for level in reversed((path, *path.parents)):     # every level it creates is 0o700, not only the last
            if not level.is_dir():
                level.mkdir(mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError as e:
        raise ValueError(f"{what} {str(path)!r} is not a usable directory: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{what} {str(path)!r} is not a directory")
    if st.st_uid != os.geteuid():
        raise ValueError(f"{what} {str(path)!r} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): "
                         f"code cached there is not loaded. Use a directory of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError(f"{what} {str(path)!r} is writable by group or others (mode "
                         f"{stat.S_IMODE(st.st_mode):o}): code cached there is not loaded. Run "
                         f"`chmod go-w {path}` or use a directory of your own")
    return path


def file_digest(path) -> str:
    return hashlib.sha256(read_file(path)).hexdigest()


def read_file(path) -> bytes:
    """The bytes of regular file `path`, read through one descriptor that never follows a link (OSError for a
    link or anything but a regular file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        return f.read()


def read_checked(artifact) -> bytes | None:
    """The artifact's bytes when their sha256 is the one recorded for it (rule 2); None otherwise."""
    try:
        data = read_file(artifact)
    except OSError:
        return None
    return data if recorded_digest(artifact) == hashlib.sha256(data).hexdigest() else None


def tree_digest(folder, copy_to=None) -> str | None:
    """sha256 over the relative names and contents of every file under `folder`; None when it holds
    anything but directories and regular files (a link could point anywhere). With copy_to (an empty
    directory), each file is written there from the very bytes read for the digest."""
    folder, h = Path(folder), hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        mode, name = os.lstat(path).st_mode, path.relative_to(folder)
        if stat.S_ISDIR(mode):
            if copy_to is not None:
                (Path(copy_to) / name).mkdir(mode=0o700, parents=True, exist_ok=True)
            continue
        if not stat.S_ISREG(mode):
            return None
        data = read_file(path)
        if copy_to is not None:
            _write_new(Path(copy_to) / name, data)
        h.update(name.as_posix().encode() + b"\0" + hashlib.sha256(data).hexdigest().encode())
    return h.hexdigest()


def _write_new(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def load_library(data: bytes, path) -> str:
    """Loads `data`, the checked bytes of a cached library, as the shared library `path` (a file of a private
    directory, named after its contents) and returns that path, for every loader of the process to use.

    Loaders take a path: ctypes.CDLL, and mindspore.ops.Custom's aot kernels, which realpath it and dlopen it
    when a graph is built. glibc's dlopen returns a library already loaded under the same path before it
    opens any file, so writing the bytes to `path` and loading it at once makes every later load of `path`
    in this process this very library, whatever becomes of the files on disk. The name stays the same
    from run to run (graphs compiled against it, which record the path, find it again), and a file of
    that name only ever holds those bytes: it is written (temporary file, then rename) from them alone."""
    path = Path(os.path.realpath(path))        # the name dlopen will be asked for, once MindSpore realpaths it
    if str(path) not in _LOADED:
        sweep_dead_temps(path.parent)
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        try:
            _write_new(tmp, data, 0o500)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        _LOADED[str(path)] = ctypes.CDLL(str(path))
    return str(path)


def sweep_dead_temps(folder) -> None:
    """Removes the temporaries of processes that died while writing into `folder` (`<name>.<tmp|pub|old>-<pid>`,
    see the module docstring): no one would ever rename or remove them. A directory goes with what it holds
    (links inside are removed, never followed), a file or a link is unlinked (a link's target stays); a live
    pid's temporaries stay."""
    for entry in Path(folder).iterdir():
        match = _TEMP_NAME.search(entry.name)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            if stat.S_ISDIR(os.lstat(entry).st_mode):
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):   # another user's process, or not a pid this OS could have
        return True
    return True


def _record_path(artifact) -> Path:
    artifact = Path(artifact)
    return artifact.with_name(artifact.name + ".sha256")


def record_digest(artifact, digest: str) -> None:
    """Writes `<artifact>.sha256` atomically."""
    record = _record_path(artifact)
    fd, tmp = tempfile.mkstemp(prefix=f"{record.name}.tmp-{os.getpid()}-", dir=record.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(digest + "\n")
        os.replace(tmp, record)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def recorded_digest(artifact) -> str | None:
    try:
        return read_file(_record_path(artifact)).decode().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def forget(artifact) -> None:
    _record_path(artifact).unlink(missing_ok=True)
