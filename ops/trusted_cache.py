"""The trust rule of on-disk caches that hold code (the kernel library, compiled graphs).

A cached artifact is loaded only when both hold:
  1. its directory is owned by the current user (st_uid == os.geteuid()) and writable by no one else
     (no group or other write bit); a directory this process creates gets mode 0o700. Another user
     who could write there could plant a library whose name (the cache key) anyone can compute.
  2. its sha256 equals the digest recorded when it was built: `<artifact>.sha256` beside it, written
     atomically (temporary file, then rename) once the artifact is complete.
An artifact failing rule 2 is rebuilt. A directory failing rule 1 is refused with a ValueError that
says why and what to do: nothing in it is loaded, and nothing is built there.
"""
from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path


def private_dir(path, what: str) -> Path:
    """`path`, created with mode 0o700 if missing; ValueError unless it passes rule 1."""
    path = Path(path)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
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
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_digest(folder) -> str | None:
    """sha256 over the relative names and contents of every file under `folder`; None when it holds
    anything but directories and regular files (a link could point anywhere)."""
    folder, h = Path(folder), hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        mode = os.lstat(path).st_mode
        if stat.S_ISDIR(mode):
            continue
        if not stat.S_ISREG(mode):
            return None
        h.update(path.relative_to(folder).as_posix().encode() + b"\0" + file_digest(path).encode())
    return h.hexdigest()


def _record_path(artifact) -> Path:
    artifact = Path(artifact)
    return artifact.with_name(artifact.name + ".sha256")


def record_digest(artifact, digest: str) -> None:
    """Writes `<artifact>.sha256` atomically."""
    record = _record_path(artifact)
    fd, tmp = tempfile.mkstemp(prefix=record.name + ".", suffix=".tmp", dir=record.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(digest + "\n")
        os.replace(tmp, record)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def recorded_digest(artifact) -> str | None:
    try:
        return _record_path(artifact).read_text().strip() or None
    except OSError:
        return None


def forget(artifact) -> None:
    _record_path(artifact).unlink(missing_ok=True)
