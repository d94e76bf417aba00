"""Indexes of the block manager's free ranges: address-ordered near-fit look-ups in O(log n).

SizeIndex holds every free range by size; OrphanIndex holds the ranges no live request grows
into ("orphans": the block before them is not a live request's last block), by size and by a
min-tree over sizes, so that "the lowest orphan of at most k blocks" costs O(log n) too.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from heapq import heappop, heappush


class SizeIndex:
    """Range starts bucketed by a size key; keys kept sorted (few distinct sizes).

    Each bucket keeps its starts in a dict (membership, insertion order) and in a lazy
    min-heap (the lowest start; entries of removed starts are dropped when they surface).
    """

    def __init__(self):
        self.buckets: dict[int, dict[int, None]] = {}
        self.heaps: dict[int, list[int]] = {}
        self.keys: list[int] = []

    def add(self, key: int, start: int) -> None:
        bucket = self.buckets.get(key)
        if bucket is None:
            self.buckets[key] = {start: None}
            self.heaps[key] = [start]
            insort(self.keys, key)
            return
        bucket[start] = None
        heap = self.heaps[key]
        heappush(heap, start)
        if len(heap) > 2 * len(bucket) + 16:  # drop stale entries; amortised O(1)
            self.heaps[key] = sorted(bucket)

    def remove(self, key: int, start: int) -> None:
        bucket = self.buckets[key]
        del bucket[start]
        if not bucket:
            del self.buckets[key]
            del self.heaps[key]
            del self.keys[bisect_left(self.keys, key)]

    def best_fit(self, key: int) -> int | None:
        """The smallest size >= key; None if no range is that large."""
        i = bisect_left(self.keys, key)
        return self.keys[i] if i < len(self.keys) else None

    def lowest_between(self, lo: int, hi: int) -> int | None:
        """The lowest start among ranges of sizes in [lo, hi]; None if there is none."""
        keys, lowest = self.keys, None
        i = bisect_left(keys, lo)
        while i < len(keys) and keys[i] <= hi:
            start = self.lowest_start(keys[i])
            if lowest is None or start < lowest:
                lowest = start
            i += 1
        return lowest

    def lowest_near_fit(self, key: int, slack: int) -> int | None:
        """The lowest start among ranges of sizes in [best fit, best fit + slack]; None if none fits."""
        size = self.best_fit(key)
        return None if size is None else self.lowest_between(size, size + slack)

    def lowest_start(self, key: int) -> int:
        heap, bucket = self.heaps[key], self.buckets[key]
        while heap[0] not in bucket:
            heappop(heap)
        return heap[0]

    def largest(self) -> tuple[int, int] | None:
        if not self.keys:
            return None
        key = self.keys[-1]
        return key, next(iter(self.buckets[key]))


class OrphanIndex:
    """The free ranges nobody grows into: start -> size, a SizeIndex, and a min-tree over sizes
    (leaf k: the lowest orphan start of size k)."""

    def __init__(self, max_size: int):
        self.size_of: dict[int, int] = {}
        self.by_size = SizeIndex()
        self._width = 1 << max(0, max_size).bit_length()      # leaves for sizes 0 .. width - 1
        self._tree = [_NONE] * (2 * self._width)              # [2 * width] min over children

    def add(self, start: int, size: int) -> None:
        self.size_of[start] = size
        self.by_size.add(size, start)
        if start < self._tree[self._width + size]:
            self._set_leaf(size, start)

    def discard(self, start: int) -> None:
        size = self.size_of.pop(start, None)
        if size is None:
            return
        self.by_size.remove(size, start)
        if self._tree[self._width + size] == start:
            bucket = self.by_size.buckets.get(size)
            self._set_leaf(size, _NONE if bucket is None else self.by_size.lowest_start(size))

    def lowest(self) -> int | None:
        """The lowest orphan start; None if there is none."""
        return self.lowest_at_most(self._width)

    def lowest_at_most(self, cap: int) -> int | None:
        """The lowest start among orphans of at most cap blocks; None if there is none."""
        tree, lo, hi = self._tree, self._width + 1, self._width + min(cap, self._width - 1) + 1
        best = _NONE
        while lo < hi:                                         # min over leaves [1, cap]
            if lo & 1:
                best = min(best, tree[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                best = min(best, tree[hi])
            lo >>= 1
            hi >>= 1
        return None if best == _NONE else best

    def _set_leaf(self, size: int, start: int) -> None:
        tree = self._tree
        i = self._width + size
        tree[i] = start
        i >>= 1
        while i:
            low = min(tree[2 * i], tree[2 * i + 1])
            if tree[i] == low:          # unchanged here: unchanged above
                return
            tree[i] = low
            i >>= 1


_NONE = 1 << 62   # an empty leaf of the min-tree: above every block id
