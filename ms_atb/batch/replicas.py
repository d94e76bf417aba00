"""Data-parallel replicas of ms-atb-generate: which requests each replica runs, its part file, and the merge.

Rules:
  1. The split is a function of the input and data_parallel_size only: every replica computes it alone and
     all get the same answer. Requests go to replicas balanced by prompt tokens (longest first, each to the
     replica with the fewest tokens so far; ties to the lower index); a replica runs its share in input order.
     The split covers the whole input, done or not, so an id belongs to the same replica in every rerun.
  2. Replica k of N writes `<output>.part<k>-of-<N>`, one result line per request, flushed as it finishes;
     no replica writes another's part or, before the merge, the output.
  3. The merge writes `<output>`: every result of the output and the parts, each id once (the first seen:
     output, then parts by name), in input order; ids the input does not hold follow in the order seen.
     It writes a side file and renames it, so `<output>` is always whole, and reads the results from their files
     as it writes them (an index of 24 bytes a line in memory). The parts are deleted only when the merged output
     holds every input id. A replica that finds, once its share is written, that the output and the parts hold
     every input id merges; as each writes its lines before it looks, the last to finish sees them all. Two
     replicas that find it at once do not both merge. `ms-atb-generate --merge` does the same by hand.
  4. Parts are read, never changed, by anyone but their writer: a torn last line (its writer was killed
     mid-write) is left out; any other line that is not a result is an error naming it.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import heapq
import os
import re
from dataclasses import dataclass
from typing import Callable, Iterable

from ms_atb.batch.id_index import IdIndex
from ms_atb.batch.output_file import open_side_file, result_id

_PART_RE = re.compile(r"\.part(\d+)-of-(\d+)$")
_OFFSET_BITS = 40             # an index entry's `where`: file number << 40 | byte offset (files under 1 TiB)


def part_path(output: str, replica: int, num_replicas: int) -> str:
    """The part file replica `replica` of `num_replicas` writes."""
    return f"{output}.part{replica}-of-{num_replicas}"


def part_paths(output: str) -> list[str]:
    """The part files of `output` that exist, of any data_parallel_size, sorted by (size, replica)."""
    found = []
    for path in glob.glob(glob.escape(output) + ".part*-of-*"):
        m = _PART_RE.search(path[len(output):])
        if m and path[:len(output)] == output and m.start() == 0:
            found.append((int(m.group(2)), int(m.group(1)), path))
    return [p for _, _, p in sorted(found)]


def assign(num_tokens, num_replicas: int):
    """numpy int32 [N]: the replica of each request (rule 1); num_tokens[i] is request i's prompt tokens (0 for
    one that cannot run)."""
    import numpy as np
    if not isinstance(num_replicas, int) or isinstance(num_replicas, bool) or num_replicas < 1:
        raise ValueError(f"data_parallel_size must be an int >= 1, got {num_replicas!r}")
    tokens = np.asarray(num_tokens, dtype=np.int64)                                  # [N]
    order = np.lexsort((np.arange(len(tokens)), -tokens))                           # longest first, then index
    owner = np.empty(len(tokens), dtype=np.int32)
    loads = [(0, k) for k in range(num_replicas)]          # a heap of (tokens so far, replica)
    for i in order.tolist():
        load, k = heapq.heappop(loads)
        owner[i] = k
        heapq.heappush(loads, (load + int(tokens[i]), k))
    return owner


def split(num_tokens: list[int], num_replicas: int) -> list[list[int]]:
    """Indices of the requests each replica runs (rule 1), each list ascending."""
    owner = assign(num_tokens, num_replicas)
    return [[int(i) for i in (owner == k).nonzero()[0]] for k in range(num_replicas)]


class ResultIndex:
    """The result lines of some files, by id (first seen wins), read back from the files when asked."""

    def __init__(self, paths: list[str]):
        self.paths = [p for p in paths if os.path.exists(p)]
        self.ids = IdIndex()
        for number, path in enumerate(self.paths):
            _index_lines(path, number, self.ids)
        self.ids.freeze()
        self._files: dict[int, object] = {}

    def __contains__(self, item_id) -> bool:
        return item_id in self.ids

    def line(self, ordinal: int) -> bytes:
        """The result line of an entry, newline included."""
        where = self.ids.where(ordinal)
        number, offset = where >> _OFFSET_BITS, where & ((1 << _OFFSET_BITS) - 1)
        f = self._files.get(number)
        if f is None:
            f = self._files[number] = open(self.paths[number], "rb")
        f.seek(offset)
        raw = f.readline()
        return raw if raw.endswith(b"\n") else raw + b"\n"

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def _index_lines(path: str, number: int, ids: IdIndex) -> None:
    """Adds each result line of path to ids (rule 4)."""
    offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if raw.strip():
                rid = result_id(raw)
                if rid is None and not raw.endswith(b"\n") and f.read(1) == b"":
                    break                                   # torn by a kill mid-write: its request reruns
                if rid is None:
                    raise ValueError(f"{path}:{lineno} is not a result line (JSON with an 'id' and 'token_ids', "
                                     f"'text' or 'error', or an OpenAI batch line); fix or remove it, or rerun "
                                     f"with --overwrite")
                ids.add(rid, number << _OFFSET_BITS | offset)
            offset += len(raw)


def written_index(output: str) -> ResultIndex:
    """The results in `output` and any of its parts."""
    return ResultIndex([output] + part_paths(output))


@dataclass
class MergeResult:
    num_written: int          # result lines in the merged output
    missing: list             # input ids with no result anywhere, in input order
    parts: list               # the part files merged (deleted when nothing is missing)


def merge(output: str, input_ids: Iterable) -> MergeResult | None:
    """Writes `output` from itself and its parts (rule 3); None when another process is merging it."""
    results = written_index(output)
    parts = results.paths[1:] if results.paths[:1] == [output] else results.paths
    tmp = f"{output}.merging"
    fd = _claim(tmp)
    if fd is None:
        return None
    try:
        used = results.ids.firsts() ^ True        # entries not to write again: later copies of an id, and used ones
        missing, written = [], 0
        with os.fdopen(os.dup(fd), "wb") as out:
            for rid in input_ids:
                k = results.ids.ordinal(rid)
                if k is None:
                    missing.append(rid)
                elif not used[k]:
                    out.write(results.line(k))
                    used[k], written = True, written + 1
            for k in (~used).nonzero()[0].tolist():       # ids the input does not hold, in the order seen
                out.write(results.line(k))
                written += 1
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, output)
    finally:
        results.close()
        os.close(fd)
    if not missing:
        for path in parts:
            os.unlink(path)
    return MergeResult(written, missing, parts)


def _claim(tmp: str) -> int | None:
    """The merge's side file, created and flocked; None while another process holds one."""
    for _ in range(3):
        try:
            fd = open_side_file(tmp, exclusive=True)
        except FileExistsError:
            try:
                fd = open_side_file(tmp)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                    return None                      # another process is merging
                raise
            os.ftruncate(fd, 0)                      # left by a merge that died: ours to redo
            return fd
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    return None


def merge_if_done(output: str, input_ids: Callable[[], Iterable]) -> str | None:
    """Merges when the output and its parts hold every input id; returns what was done, or None when a replica
    is still writing (it merges when it is done). input_ids: a fresh iterator of the input's ids each call."""
    results = written_index(output)
    try:
        done = all(rid in results for rid in input_ids())
    finally:
        results.close()
    if not done or not part_paths(output):
        return None
    result = merge(output, input_ids())
    if result is None:
        return None                 # another replica merges
    return f"merged {result.num_written} results from {len(result.parts)} part files into {output}"
