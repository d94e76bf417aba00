"""The scheduler's waiting queues: first come, first served, or grouped by shared prompt prefix.

Both queues take the same calls from the Scheduler: `add(seq, step)` on arrival (step: the number
of schedule() calls made before it arrived), `add_preempted(seq)` for a request sent back by
preemption (it goes ahead of every other, as it was admitted once already), `peek()` for the next
request to admit, `pop()` to admit it, `remove(seq)` for a waiting request that ends unadmitted.

PrefixQueue keeps the waiting prompts in sorted token order. In that order every set of prompts
that share a prefix is one contiguous run (the order of a depth-first walk of their token trie, with
no trie to maintain), so admitting along it admits a prefix's requests together: the first computes
the prefix and the others find it committed, in the same step or while it is still in flight. The
next request is the neighbour of the last admitted prompt (the first at or after it, or the last
before it when that shares a longer prefix, e.g. a late arrival of the group in flight), so the
walk carries on where the cache is warm instead of restarting from the smallest prompt. The
block manager's cache is not consulted: what the queue last admitted is what is cached or in
flight. Insertion and lookup are O(log n) comparisons (plus the list shift of `bisect.insort`).

The bound on waiting: a request that arrived at step s is admitted before more than
`max_overtakes` requests that arrived at a later step are admitted (readmissions after preemption
do not count; they go first under either policy). When the requests of the oldest arrival step
have been overtaken that many times, all of them move, in prefix order, to a queue that is served
before the sorted ones. Requests that arrive together (a whole batch added before the first step)
are one arrival step: the walk admits all of them in one pass, so none waits on a later one.
"""
from __future__ import annotations

import bisect
import collections
from typing import Iterator

from ms_atb.core.sequence import Sequence

POLICIES = ("fcfs", "prefix")
MAX_OVERTAKES = 64           # admissions of later arrivals a waiting request tolerates


class FcfsQueue:
    """Arrival order; a preempted request goes back to the front."""

    def __init__(self):
        self._queue: collections.deque[Sequence] = collections.deque()

    def add(self, seq: Sequence, step: int = 0) -> None:
        self._queue.append(seq)

    def add_preempted(self, seq: Sequence) -> None:
        self._queue.appendleft(seq)

    def peek(self) -> Sequence:
        return self._queue[0]

    def pop(self) -> Sequence:
        return self._queue.popleft()

    def remove(self, seq: Sequence) -> None:
        self._queue.remove(seq)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._queue)


def common_prefix_len(a: tuple, b: tuple) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixQueue:
    """Sorted prompt order from the last admitted prompt, with the arrival bound of the module
    docstring. Invariants:
    1. every waiting request is in exactly one of `_front` (preempted), `_due` (overtaken
       max_overtakes times) and `_sorted`;
    2. `_sorted` holds keys (prompt tokens, serial) in ascending order; the serial makes keys
       unique and orders identical prompts by arrival;
    3. `_steps` maps each arrival step with a request in `_sorted` to [requests, overtakes], in
       increasing step order."""

    def __init__(self, max_overtakes: int = MAX_OVERTAKES):
        if not isinstance(max_overtakes, int) or max_overtakes < 0:
            raise ValueError(f"max_overtakes must be an integer >= 0, got {max_overtakes!r}")
        self.max_overtakes = max_overtakes
        self._front: collections.deque[Sequence] = collections.deque()
        self._due: collections.deque[Sequence] = collections.deque()
        self._sorted: list[tuple[tuple, int]] = []
        self._by_serial: dict[int, tuple[Sequence, int]] = {}   # serial -> (sequence, arrival step)
        self._keys: dict[int, tuple[tuple, int]] = {}           # id(sequence) -> its key in _sorted
        self._steps: collections.OrderedDict[int, list[int]] = collections.OrderedDict()
        self._serial = 0
        self._last: tuple = ()                                  # prompt tokens last admitted

    def add(self, seq: Sequence, step: int = 0) -> None:
        assert not self._steps or step >= next(reversed(self._steps)), "arrival steps only grow"
        key = (tuple(seq.prompt_token_ids), self._serial)
        self._serial += 1
        bisect.insort(self._sorted, key)
        self._by_serial[key[1]] = (seq, step)
        self._keys[id(seq)] = key
        self._steps.setdefault(step, [0, 0])[0] += 1

    def add_preempted(self, seq: Sequence) -> None:
        self._front.appendleft(seq)

    def peek(self) -> Sequence:
        if self._front:
            return self._front[0]
        self._promote_overdue()
        if self._due:
            return self._due[0]
        return self._by_serial[self._sorted[self._next_index()][1]][0]

    def pop(self) -> Sequence:
        seq = self.peek()
        if self._front:
            self._front.popleft()
        elif self._due:
            self._due.popleft()
        else:
            self._take(self._next_index())
        self._last = tuple(seq.prompt_token_ids)
        return seq

    def remove(self, seq: Sequence) -> None:
        key = self._keys.get(id(seq))
        if key is not None:
            self._take(bisect.bisect_left(self._sorted, key), admitted=False)
        elif seq in self._front:
            self._front.remove(seq)
        else:
            self._due.remove(seq)

    def __len__(self) -> int:
        return len(self._front) + len(self._due) + len(self._sorted)

    def __iter__(self) -> Iterator[Sequence]:
        yield from self._front
        yield from self._due
        for key in self._sorted:
            yield self._by_serial[key[1]][0]

    # ---- internals ------------------------------------------------------------------------
    def _next_index(self) -> int:
        """Index in _sorted of the next request: the first at or after the last admitted prompt,
        or the last before it when that one shares a longer prefix with it."""
        keys, n = self._sorted, len(self._sorted)
        at = bisect.bisect_left(keys, (self._last, -1))
        after, before = at % n, at - 1
        if before >= 0 and after != before and \
                common_prefix_len(keys[before][0], self._last) > common_prefix_len(keys[after][0], self._last):
            return before
        return after

    def _take(self, index: int, admitted: bool = True) -> None:
        key = self._sorted.pop(index)
        seq, step = self._by_serial.pop(key[1])
        del self._keys[id(seq)]
        entry = self._steps[step]
        entry[0] -= 1
        if entry[0] == 0:
            del self._steps[step]
        if admitted:
            for older, e in self._steps.items():
                if older >= step:
                    break
                e[1] += 1

    def _promote_overdue(self) -> None:
        """Moves the requests of the oldest arrival step to _due once they are overtaken
        max_overtakes times, in sorted order from the last admitted prompt."""
        if self._due or not self._steps:
            return
        step, (count, overtakes) = next(iter(self._steps.items()))
        if overtakes < self.max_overtakes:
            return
        start = bisect.bisect_left(self._sorted, (self._last, -1))
        order = self._sorted[start:] + self._sorted[:start]
        for key in order:
            seq, s = self._by_serial[key[1]]
            if s == step:
                self._due.append(seq)
        for seq in self._due:
            self._take(bisect.bisect_left(self._sorted, self._keys[id(seq)]), admitted=False)
        assert len(self._due) == count


def make_queue(policy: str):
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {list(POLICIES)}, got {policy!r}")
    return FcfsQueue() if policy == "fcfs" else PrefixQueue()
