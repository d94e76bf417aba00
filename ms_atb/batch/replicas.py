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
     It writes a temporary file and renames it, so `<output>` is always whole. The parts are deleted
     only when the merged output holds every input id. A replica that finds, once its share is written, that
     the output and the parts hold every input id merges; as each writes its lines before it looks, the
     last to finish sees them all. `ms-atb-generate --merge` does the same by hand.
  4. Parts are read, never changed, by anyone but their writer: a torn last line (its writer was killed
     mid-write) is left out; any other line that is not a result is an error naming it.
"""
from __future__ import annotations

import contextlib
import glob
import heapq
import os
import re
from dataclasses import dataclass

from ms_atb.batch.output_file import OutputLock, result_id

_PART_RE = re.compile(r"\.part(\d+)-of-(\d+)$")


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


def split(num_tokens: list[int], num_replicas: int) -> list[list[int]]:
    """Indices of the requests each replica runs (rule 1), each list ascending; num_tokens[i] is request i's
    prompt tokens (0 for one that cannot run)."""
    if not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"data_parallel_size must be an int >= 1, got {num_replicas!r}")
    shares: list[list[int]] = [[] for _ in range(num_replicas)]
    loads = [(0, k) for k in range(num_replicas)]          # a heap of (tokens so far, replica)
    for i in sorted(range(len(num_tokens)), key=lambda i: (-num_tokens[i], i)):
        load, k = heapq.heappop(loads)
        shares[k].append(i)
        heapq.heappush(loads, (load + num_tokens[i], k))
    return [sorted(s) for s in shares]


def read_results(path: str) -> dict:
    """{id: the result line (bytes, newline included)} of a result file, without changing it (rule 4);
    {} when it does not exist."""
    if not os.path.exists(path):
        return {}
    results = {}
    with open(path, "rb") as f:
        lines = f.readlines()
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        rid = result_id(raw)
        if rid is None and lineno == len(lines) and not raw.endswith(b"\n"):
            break                                   # torn by a kill mid-write: its request reruns
        if rid is None:
            raise ValueError(f"{path}:{lineno} is not a result line (JSON with an 'id' and 'token_ids', 'text' "
                             f"or 'error', or an OpenAI batch line); fix or remove it, or rerun with --overwrite")
        results.setdefault(rid, raw if raw.endswith(b"\n") else raw + b"\n")
    return results


def written_ids(output: str) -> set:
    """Ids with a result in `output` or any of its parts."""
    ids = set(read_results(output))
    for path in part_paths(output):
        ids.update(read_results(path))
    return ids


@dataclass
class MergeResult:
    num_written: int          # result lines in the merged output
    missing: list             # input ids with no result anywhere, in input order
    parts: list               # the part files merged (deleted when nothing is missing)


def merge(output: str, input_ids: list) -> MergeResult:
    """Writes `output` from itself and its parts (rule 3); the caller holds the output's lock."""
    parts = part_paths(output)
    results = read_results(output)
    for path in parts:
        for rid, line in read_results(path).items():
            results.setdefault(rid, line)
    known = set(input_ids)
    ordered = [rid for rid in input_ids if rid in results] + [rid for rid in results if rid not in known]
    tmp = f"{output}.merging"
    with open(tmp, "wb") as f:
        for rid in ordered:
            f.write(results[rid])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, output)
    missing = [rid for rid in input_ids if rid not in results]
    if not missing:
        for path in parts:
            os.unlink(path)
    return MergeResult(len(ordered), missing, parts)


def merge_if_done(output: str, input_ids: list, output_locked: bool = False) -> str | None:
    """Merges when the output and its parts hold every input id; returns what was done, or None when a
    replica is still writing (it merges when it is done). output_locked: this process holds the output's lock."""
    if not set(input_ids) <= written_ids(output):
        return None
    try:
        lock = contextlib.nullcontext() if output_locked else OutputLock(output)
    except ValueError:
        return None                 # another replica merges
    with lock:
        if not part_paths(output):
            return None             # merged by another replica meanwhile
        result = merge(output, input_ids)
    return f"merged {result.num_written} results from {len(result.parts)} part files into {output}"
